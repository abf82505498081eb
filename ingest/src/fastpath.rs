//! A byte-level scanner for step lines exactly as the worker writes them: no whitespace, keys
//! of the schema in any order, no escapes. It compares keys as bytes and converts only the numbers
//! ingest uses, which makes it several times faster than serde on these lines (serde spends most
//! of its time matching key strings).
//!
//! It is strict on purpose: on anything else (an unknown key, whitespace, an escape, a duplicate
//! or missing field, a number JSON does not allow, a value of another type) it returns `None` and
//! the caller parses the line with serde, which either reads it or says precisely what is wrong.
//! So it never accepts a line serde would refuse, and a writer that adds a field only makes
//! ingest slower, not wrong. A property test holds it to that.

use std::borrow::Cow;

use crate::record::{CommLine, CommLines, MemLine, StepLine, STEP_PREFIX};

/// Parses a line that starts with [`STEP_PREFIX`]; `None` means "ask serde".
pub fn parse_step(line: &[u8]) -> Option<StepLine<'_>> {
    let mut c = Cur { b: line, i: line.strip_prefix(STEP_PREFIX).map(|_| STEP_PREFIX.len())? };
    let mut seen = 0u32;
    let mut s = StepLine {
        rank: 0,
        step: 0,
        skipped: false,
        loss: 0.0,
        tokens: 0,
        samples: 0,
        step_ms: 0.0,
        forward_ms: 0.0,
        backward_ms: 0.0,
        optimizer_ms: 0.0,
        comm_ms: 0.0,
        exposed_comm_ms: 0.0,
        comm: CommLines::default(),
        memory: MemLine::default(),
        energy_j: None,
    };
    loop {
        let key = c.key()?;
        let bit = match key {
            b"ts" => c.skip_number().map(|_| 0)?,
            b"rank" => c.u32().map(|v| s.rank = v).map(|_| 1)?,
            b"step" => c.u32().map(|v| s.step = v).map(|_| 2)?,
            b"warmup" => c.boolean().map(|_| 3)?,
            b"loss" => c.f64().map(|v| s.loss = v).map(|_| 4)?,
            b"skipped" => c.boolean().map(|v| s.skipped = v).map(|_| 5)?,
            b"loss_scale" => c.opt(Cur::skip_number).map(|_| 6)?,
            b"tokens" => c.u64().map(|v| s.tokens = v).map(|_| 7)?,
            b"samples" => c.u64().map(|v| s.samples = v).map(|_| 8)?,
            b"step_ms" => c.f64().map(|v| s.step_ms = v).map(|_| 9)?,
            b"forward_ms" => c.f64().map(|v| s.forward_ms = v).map(|_| 10)?,
            b"backward_ms" => c.f64().map(|v| s.backward_ms = v).map(|_| 11)?,
            b"optimizer_ms" => c.f64().map(|v| s.optimizer_ms = v).map(|_| 12)?,
            b"comm_ms" => c.f64().map(|v| s.comm_ms = v).map(|_| 13)?,
            b"exposed_comm_ms" => c.f64().map(|v| s.exposed_comm_ms = v).map(|_| 14)?,
            b"comm" => c.comm().map(|v| s.comm = v).map(|_| 15)?,
            b"memory" => c.memory().map(|v| s.memory = v).map(|_| 16)?,
            b"power_w" => c.opt(Cur::skip_number).map(|_| 17)?,
            b"energy_j" => c.opt(Cur::f64).map(|v| s.energy_j = v).map(|_| 18)?,
            b"gpu_util_pct" => c.opt(Cur::skip_number).map(|_| 19)?,
            _ => return None,
        };
        if seen & (1 << bit) != 0 {
            return None;
        }
        seen |= 1 << bit;
        match c.next()? {
            b',' => continue,
            b'}' => break,
            _ => return None,
        }
    }
    // Every field serde requires: rank, step, loss, tokens, samples and the six times.
    const REQUIRED: u32 = (1 << 1) | (1 << 2) | (1 << 4) | (0x7F << 7) | (1 << 14);
    (c.i == line.len() && seen & REQUIRED == REQUIRED).then_some(s)
}

/// A scanned number: its text and, while it fits, its digits as an integer and a power of ten.
struct Number<'a> {
    span: &'a [u8],
    integer: bool,
    negative: bool,
    /// The significant digits read so far (leading zeros skipped), exact while `digits <= 19`.
    mantissa: u64,
    digits: u32,
    exp10: i32,
}

impl Number<'_> {
    fn push(&mut self, d: u8) {
        if self.digits == 0 && d == b'0' {
            return;
        }
        self.digits += 1;
        if self.digits <= 19 {
            self.mantissa = self.mantissa * 10 + u64::from(d - b'0');
        }
    }

    /// Clinger's fast path: when the digits fit in 53 bits and the power of ten is at most 22,
    /// both are exact doubles and one IEEE multiplication or division rounds correctly.
    fn exact(&self) -> Option<f64> {
        const POW10: [f64; 23] = [
            1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18,
            1e19, 1e20, 1e21, 1e22,
        ];
        if self.digits > 19 || self.mantissa >= 1 << 53 {
            return None;
        }
        let m = self.mantissa as f64;
        let v = match self.exp10 {
            0..=22 => m * POW10[self.exp10 as usize],
            -22..=-1 => m / POW10[(-self.exp10) as usize],
            _ => return None,
        };
        Some(if self.negative { -v } else { v })
    }
}

struct Cur<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cur<'a> {
    fn next(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn expect(&mut self, lit: &[u8]) -> Option<()> {
        if self.b.get(self.i..self.i + lit.len())? == lit {
            self.i += lit.len();
            Some(())
        } else {
            None
        }
    }

    /// `"name":` without escapes or control characters.
    fn key(&mut self) -> Option<&'a [u8]> {
        let s = self.string()?;
        self.expect(b":")?;
        Some(s)
    }

    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b"\"")?;
        let start = self.i;
        // Keys are short: a plain loop beats a vectorised search here.
        loop {
            match self.next()? {
                b'"' => return Some(&self.b[start..self.i - 1]),
                b'\\' | 0..=0x1F | 0x80..=0xFF => return None,
                _ => {}
            }
        }
    }

    /// A JSON number, checked against JSON's grammar, with its decimal digits gathered on the way.
    fn number(&mut self) -> Option<Number<'a>> {
        let start = self.i;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let mut n = Number { span: &[], integer: true, negative, mantissa: 0, digits: 0, exp10: 0 };
        match self.next()? {
            b'0' => {}
            d @ b'1'..=b'9' => {
                n.push(d);
                self.digits(&mut n, 0);
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            n.integer = false;
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits(&mut n, -1);
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            n.integer = false;
            let neg = match self.peek()? {
                b'-' => {
                    self.i += 1;
                    true
                }
                b'+' => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            let mut e: i32 = 0;
            while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
                e = e.saturating_mul(10).saturating_add(i32::from(d - b'0'));
                self.i += 1;
            }
            n.exp10 = n.exp10.saturating_add(if neg { -e } else { e });
        }
        n.span = &self.b[start..self.i];
        Some(n)
    }

    /// Digits; each one after the point (`scale` −1) lowers the exponent.
    fn digits(&mut self, n: &mut Number<'a>, scale: i32) {
        while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
            n.push(d);
            n.exp10 += scale;
            self.i += 1;
        }
    }

    fn skip_number(&mut self) -> Option<()> {
        self.number().map(|_| ())
    }

    fn f64(&mut self) -> Option<f64> {
        let n = self.number()?;
        if let Some(v) = n.exact() {
            return Some(v);
        }
        // The span is ASCII by construction; core's parser is exact (correctly rounded).
        let v: f64 = std::str::from_utf8(n.span).ok()?.parse().ok()?;
        v.is_finite().then_some(v)
    }

    fn u64(&mut self) -> Option<u64> {
        let n = self.number()?;
        if !n.integer || n.negative || n.digits > 19 {
            return None;
        }
        // Up to 19 digits fit in a u64 (the 20-digit values are refused, as too rare to matter).
        Some(n.mantissa)
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    fn boolean(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.expect(b"true").map(|_| true),
            b'f' => self.expect(b"false").map(|_| false),
            _ => None,
        }
    }

    /// `null` or what `f` reads.
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek() == Some(b'n') {
            return self.expect(b"null").map(|_| None);
        }
        f(self).map(Some)
    }

    /// An object of `f`'s entries; `f` reads the value of one key.
    fn object(&mut self, mut f: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.expect(b"{")?;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.key()?;
            f(self, key)?;
            match self.next()? {
                b',' => continue,
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }

    fn comm(&mut self) -> Option<CommLines<'a>> {
        let mut out = CommLines::default();
        self.object(|c, kind| {
            let name = std::str::from_utf8(kind).ok()?;
            let mut line = CommLine::default();
            let mut seen = 0u8;
            c.object(|c, k| {
                let bit = match k {
                    b"calls" => c.u64().map(|v| line.calls = v).map(|_| 0)?,
                    b"bytes" => c.u64().map(|v| line.bytes = v).map(|_| 1)?,
                    b"ms" => c.f64().map(|v| line.ms = v).map(|_| 2)?,
                    b"max_bytes" => c.skip_number().map(|_| 3)?,
                    b"bus_gbps" => c.opt(Cur::skip_number).map(|_| 4)?,
                    _ => return None,
                };
                (seen & (1 << bit) == 0).then(|| seen |= 1 << bit)
            })?;
            out.push(Cow::Borrowed(name), line);
            Some(())
        })?;
        Some(out)
    }

    fn memory(&mut self) -> Option<MemLine> {
        let mut m = MemLine::default();
        let mut seen = 0u8;
        self.object(|c, k| {
            let bit = match k {
                b"allocated_bytes" => c.opt(Cur::u64).map(|v| m.allocated_bytes = v).map(|_| 0)?,
                b"peak_allocated_bytes" => c.opt(Cur::u64).map(|v| m.peak_allocated_bytes = v).map(|_| 1)?,
                b"reserved_bytes" => c.opt(Cur::u64).map(|v| m.reserved_bytes = v).map(|_| 2)?,
                b"peak_reserved_bytes" => c.opt(Cur::u64).map(|v| m.peak_reserved_bytes = v).map(|_| 3)?,
                b"alloc_retries" | b"ooms" => c.opt(Cur::skip_number).map(|_| if k == b"ooms" { 4 } else { 5 })?,
                b"nvml_used_bytes" => c.opt(Cur::u64).map(|v| m.nvml_used_bytes = v).map(|_| 6)?,
                b"rss_bytes" => c.opt(Cur::u64).map(|v| m.rss_bytes = v).map(|_| 7)?,
                _ => return None,
            };
            (seen & (1 << bit) == 0).then(|| seen |= 1 << bit)
        })?;
        Some(m)
    }
}
