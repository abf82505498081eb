//! A byte-level scanner for step lines exactly as the worker writes them: no whitespace, keys
//! of the schema in any order, no escapes. It compares keys as bytes and converts numbers itself,
//! which spares serde's matching of key strings and its buffering of every internally tagged
//! record (`bench/results/ingest.json` has the resulting speed).
//!
//! It is strict on purpose: on anything else (an unknown key, whitespace, an escape, a duplicate
//! or missing field, a number JSON does not allow or its type cannot hold, a value of another
//! type) it returns `None` and the caller parses the line with the schema's parser, which either
//! reads it or says precisely what is wrong. So it never accepts a line the schema refuses, and a
//! writer that adds a field only makes ingest slower, not wrong. A property test holds it to that.

use zerobench_schema::collective::CommKey;

use crate::record::{CommLine, CommLines, MemLine, StepLine, STEP_PREFIX};

/// The keys of a step record after `event` and `v`, in the order the worker writes them.
const WRITER_ORDER: [&[u8]; 22] = [
    b"ts",
    b"rank",
    b"step",
    b"warmup",
    b"loss",
    b"skipped",
    b"loss_scale",
    b"tokens",
    b"samples",
    b"step_ms",
    b"forward_ms",
    b"backward_ms",
    b"optimizer_ms",
    b"comm_ms",
    b"exposed_comm_ms",
    b"other_ms",
    b"overhead_ms",
    b"comm",
    b"memory",
    b"power_w",
    b"energy_j",
    b"gpu_util_pct",
];

/// Parses a line that starts with [`STEP_PREFIX`]; `None` means "ask serde".
pub fn parse_step(line: &[u8]) -> Option<StepLine<'_>> {
    let mut c = Cur { b: line, i: line.strip_prefix(STEP_PREFIX).map(|_| STEP_PREFIX.len())? };
    let mut seen = 0u32;
    let mut s = StepLine {
        rank: 0,
        step: 0,
        skipped: false,
        loss: None,
        tokens: 0,
        samples: 0,
        step_ms: 0.0,
        forward_ms: 0.0,
        backward_ms: 0.0,
        optimizer_ms: 0.0,
        comm_ms: 0.0,
        exposed_comm_ms: 0.0,
        other_ms: 0.0,
        overhead_ms: 0.0,
        comm: CommLines::default(),
        memory: MemLine::default(),
        energy_j: None,
        gpu_util_pct: None,
    };
    let mut expected = 0usize;
    loop {
        // The writer's key order, tried first: one comparison of the whole `"key":` token.
        let key = match WRITER_ORDER.get(expected) {
            Some(k) if c.key_is(k) => {
                expected += 1;
                *k
            }
            _ => c.key()?,
        };
        // The bit of a key is its place in WRITER_ORDER. Values ingest does not use are still
        // checked against their type, so that the line is valid as the schema defines it.
        let bit = match key {
            b"ts" => c.skip_f64().map(|_| 0)?,
            b"rank" => c.u32().map(|v| s.rank = v).map(|_| 1)?,
            b"step" => c.u32().map(|v| s.step = v).map(|_| 2)?,
            b"warmup" => c.boolean().map(|_| 3)?,
            // Required, and `null` where the loss was not finite.
            b"loss" => c.opt(Cur::f64).map(|v| s.loss = v).map(|_| 4)?,
            b"skipped" => c.boolean().map(|v| s.skipped = v).map(|_| 5)?,
            b"loss_scale" => c.opt(Cur::skip_f64).map(|_| 6)?,
            b"tokens" => c.u64().map(|v| s.tokens = v).map(|_| 7)?,
            b"samples" => c.u64().map(|v| s.samples = v).map(|_| 8)?,
            b"step_ms" => c.f64().map(|v| s.step_ms = v).map(|_| 9)?,
            b"forward_ms" => c.f64().map(|v| s.forward_ms = v).map(|_| 10)?,
            b"backward_ms" => c.f64().map(|v| s.backward_ms = v).map(|_| 11)?,
            b"optimizer_ms" => c.f64().map(|v| s.optimizer_ms = v).map(|_| 12)?,
            b"comm_ms" => c.f64().map(|v| s.comm_ms = v).map(|_| 13)?,
            b"exposed_comm_ms" => c.f64().map(|v| s.exposed_comm_ms = v).map(|_| 14)?,
            b"other_ms" => c.f64().map(|v| s.other_ms = v).map(|_| 15)?,
            b"overhead_ms" => c.f64().map(|v| s.overhead_ms = v).map(|_| 16)?,
            b"comm" => c.comm().map(|v| s.comm = v).map(|_| 17)?,
            b"memory" => c.memory().map(|v| s.memory = v).map(|_| 18)?,
            b"power_w" => c.opt(Cur::skip_f64).map(|_| 19)?,
            b"energy_j" => c.opt(Cur::f64).map(|v| s.energy_j = v).map(|_| 20)?,
            // A value past u32 is left to the schema's parser, which refuses it.
            b"gpu_util_pct" => c
                .opt(Cur::u64)
                .and_then(|v| v.map_or(Some(None), |x| u32::try_from(x).ok().map(Some)))
                .map(|v| s.gpu_util_pct = v)
                .map(|_| 21)?,
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
    // Every field the schema's `Step` requires: all but these (`other_ms` and `overhead_ms`
    // default to 0, as in version 1 logs).
    const OPTIONAL: u32 = (1 << 6) | (1 << 15) | (1 << 16) | (1 << 19) | (1 << 20) | (1 << 21);
    const REQUIRED: u32 = ((1 << WRITER_ORDER.len()) - 1) & !OPTIONAL;
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

    /// The correctly rounded double of `mantissa · 10^exp10`, for up to 19 digits and a power of
    /// ten within ±22 (every number the worker writes); `None` otherwise.
    fn exact(&self) -> Option<f64> {
        if self.digits > 19 {
            return None;
        }
        let v = decimal_to_f64(self.mantissa, self.exp10)?;
        Some(if self.negative { -v } else { v })
    }
}

/// The value of eight ASCII digits held little-endian in a word (the first digit in the low byte).
fn eight_digit_value(v: u64) -> u64 {
    let v = v - 0x3030_3030_3030_3030;
    let v = (v * 10 + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    let v = (v * 100 + (v >> 16)) & 0x0000_FFFF_0000_FFFF;
    (v * 10_000 + (v >> 32)) & 0xFFFF_FFFF
}

/// `m · 10^e`, correctly rounded (to nearest, ties to even), for `|e| <= 22`.
///
/// Clinger's fast path when `m` fits in 53 bits (both factors are exact doubles and one IEEE
/// operation rounds correctly). Otherwise with integers: `m · 10^e` in 128 bits for `e >= 0`
/// (Rust's u128 → f64 conversion rounds correctly); for `e < 0`, `m` is shifted to the top of 128
/// bits and divided by `10^-e` (< 2^74), which leaves a quotient of at least 54 bits: 53 for the
/// mantissa, one to round with, and the rest and the remainder as the sticky bit.
pub fn decimal_to_f64(m: u64, e: i32) -> Option<f64> {
    const POW10: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
        1e20, 1e21, 1e22,
    ];
    if !(-22..=22).contains(&e) {
        return None;
    }
    if m == 0 {
        return Some(0.0);
    }
    if m < 1 << 53 {
        return Some(if e >= 0 { m as f64 * POW10[e as usize] } else { m as f64 / POW10[(-e) as usize] });
    }
    let p = 10u128.pow(e.unsigned_abs());
    if e >= 0 {
        return u128::from(m).checked_mul(p).map(|x| x as f64);
    }
    let lz = m.leading_zeros();
    let n = u128::from(m) << (lz + 64);
    let (q, r) = (n / p, n % p);
    let bits = 128 - q.leading_zeros();
    let shift = bits - 53;
    let mut mant = (q >> shift) as u64;
    let round = (q >> (shift - 1)) & 1 == 1;
    let sticky = r != 0 || q & ((1u128 << (shift - 1)) - 1) != 0;
    let mut exp = shift as i32 - (lz as i32 + 64);
    if round && (sticky || mant & 1 == 1) {
        mant += 1;
        if mant == 1 << 53 {
            mant >>= 1;
            exp += 1;
        }
    }
    // mant is in [2^52, 2^53): the double is mant · 2^exp, a normal number for every |e| <= 22.
    let biased = u64::try_from(exp + 52 + 1023).ok()?;
    Some(f64::from_bits((biased << 52) | (mant & ((1 << 52) - 1))))
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

    /// Whether `"name":` comes next; if so, it is consumed.
    fn key_is(&mut self, name: &[u8]) -> bool {
        let n = name.len();
        let Some(token) = self.b.get(self.i..self.i + n + 3) else { return false };
        // Keys are short: comparing in line beats a call to memcmp.
        let same = token[1..=n].iter().zip(name).all(|(a, b)| a == b);
        if token[0] == b'"' && same && token[n + 1] == b'"' && token[n + 2] == b':' {
            self.i += n + 3;
            true
        } else {
            false
        }
    }

    /// The next eight bytes as a little-endian word, if they are all ASCII digits.
    fn eight_digits(&self) -> Option<u64> {
        let bytes: [u8; 8] = self.b.get(self.i..self.i + 8)?.try_into().ok()?;
        let v = u64::from_le_bytes(bytes);
        // Each byte is 0x30..=0x39: high nibble 3, and adding 6 does not carry into it.
        let digits =
            (v & 0xF0F0_F0F0_F0F0_F0F0) | ((v.wrapping_add(0x0606_0606_0606_0606) & 0xF0F0_F0F0_F0F0_F0F0) >> 4);
        (digits == 0x3333_3333_3333_3333).then_some(v)
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
            let (negative, e) = self.exponent()?;
            let e = i32::try_from(e).unwrap_or(i32::MAX);
            n.exp10 = n.exp10.saturating_add(if negative { -e } else { e });
        }
        n.span = &self.b[start..self.i];
        Some(n)
    }

    /// After the `e` of a number: the exponent's sign (negative?) and value, saturating; `None`
    /// without a digit.
    fn exponent(&mut self) -> Option<(bool, u32)> {
        let negative = match self.peek()? {
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
        self.peek().filter(u8::is_ascii_digit)?;
        let mut e: u32 = 0;
        while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
            e = e.saturating_mul(10).saturating_add(u32::from(d - b'0'));
            self.i += 1;
        }
        Some((negative, e))
    }

    /// Digits; each one after the point (`scale` −1) lowers the exponent.
    fn digits(&mut self, n: &mut Number<'a>, scale: i32) {
        // Eight at a time once a significant digit is in and while 19 digits still fit.
        while n.digits > 0 && n.digits <= 11 {
            let Some(v) = self.eight_digits() else { break };
            n.mantissa = n.mantissa * 100_000_000 + eight_digit_value(v);
            n.digits += 8;
            n.exp10 += 8 * scale;
            self.i += 8;
        }
        while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
            n.push(d);
            n.exp10 += scale;
            self.i += 1;
        }
    }

    /// A JSON number that ingest does not use but the schema reads as an `f64`: checked against
    /// JSON's grammar and for being finite, not converted (converting the long fractions of
    /// power and bandwidth figures would cost more than the rest of the line). The bound is
    /// conservative: any magnitude up to 10^300 passes; anything larger is left to the schema's
    /// parser.
    fn skip_f64(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let start = self.i;
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.skip_digits(),
            _ => return None,
        }
        // The value is below 10^(integer digits + exponent).
        let mut magnitude = self.i - start;
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.next().filter(u8::is_ascii_digit)?;
            self.skip_digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            let (negative, e) = self.exponent()?;
            // A negative exponent only makes the value smaller (down to 0, which is finite).
            if !negative {
                magnitude = magnitude.saturating_add(usize::try_from(e).unwrap_or(usize::MAX));
            }
        }
        (magnitude <= 300).then_some(())
    }

    /// A JSON number that ingest does not use but the schema reads as the unsigned integer `T`:
    /// checked, not converted, unless it has more digits than `T` surely holds.
    fn skip_unsigned<T: std::str::FromStr>(&mut self) -> Option<()> {
        let start = self.i;
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.skip_digits(),
            _ => return None,
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let digits = &self.b[start..self.i];
        // Every number of ⌊bits · 0.3⌋ digits fits (0.3 < log10 2): 9 for u32, 19 for u64.
        let safe = 8 * std::mem::size_of::<T>() * 3 / 10;
        (digits.len() <= safe || std::str::from_utf8(digits).ok()?.parse::<T>().is_ok()).then_some(())
    }

    fn skip_digits(&mut self) {
        while self.eight_digits().is_some() {
            self.i += 8;
        }
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
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
        if !n.integer || n.negative {
            return None;
        }
        if n.digits <= 19 {
            return Some(n.mantissa);
        }
        // Twenty digits or more (rare): the standard parser says whether the value fits.
        std::str::from_utf8(n.span).ok()?.parse().ok()
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

    /// An object of `f`'s entries; `f` reads the value of one key. `order` is the writer's key
    /// order, tried first.
    fn object(&mut self, order: &[&'static [u8]], mut f: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.expect(b"{")?;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Some(());
        }
        let mut expected = 0usize;
        loop {
            let key = match order.get(expected) {
                Some(k) if self.key_is(k) => {
                    expected += 1;
                    *k
                }
                _ => self.key()?,
            };
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
        self.object(&[], |c, kind| {
            let mut line = CommLine::default();
            let mut seen = 0u8;
            c.object(&[b"calls", b"bytes", b"ms", b"max_bytes", b"bus_gbps"], |c, k| {
                let bit = match k {
                    b"calls" => c.u64().map(|v| line.calls = v).map(|_| 0)?,
                    b"bytes" => c.u64().map(|v| line.bytes = v).map(|_| 1)?,
                    b"ms" => c.f64().map(|v| line.ms = v).map(|_| 2)?,
                    b"max_bytes" => c.skip_unsigned::<u64>().map(|_| 3)?,
                    b"bus_gbps" => c.opt(Cur::skip_f64).map(|_| 4)?,
                    _ => return None,
                };
                (seen & (1 << bit) == 0).then(|| seen |= 1 << bit)
            })?;
            // All but bus_gbps are required.
            if seen & 0b1111 != 0b1111 {
                return None;
            }
            // A kind named twice is left to the schema's parser (a map keeps the last).
            let added = match CommKey::from_name(kind) {
                Some(k) => out.push_known(k, line),
                None => out.push(std::str::from_utf8(kind).ok()?, line),
            };
            added.then_some(())
        })?;
        Some(out)
    }

    fn memory(&mut self) -> Option<MemLine> {
        let mut m = MemLine::default();
        let mut seen = 0u8;
        self.object(
            &[
                b"allocated_bytes",
                b"peak_allocated_bytes",
                b"reserved_bytes",
                b"peak_reserved_bytes",
                b"alloc_retries",
                b"ooms",
                b"nvml_used_bytes",
                b"rss_bytes",
            ],
            |c, k| {
                let bit = match k {
                    b"allocated_bytes" => c.opt(Cur::u64).map(|v| m.allocated_bytes = v).map(|_| 0)?,
                    b"peak_allocated_bytes" => c.opt(Cur::u64).map(|v| m.peak_allocated_bytes = v).map(|_| 1)?,
                    b"reserved_bytes" => c.opt(Cur::u64).map(|v| m.reserved_bytes = v).map(|_| 2)?,
                    b"peak_reserved_bytes" => c.opt(Cur::u64).map(|v| m.peak_reserved_bytes = v).map(|_| 3)?,
                    b"alloc_retries" => c.opt(Cur::skip_unsigned::<u64>).map(|_| 4)?,
                    b"ooms" => c.opt(Cur::skip_unsigned::<u64>).map(|_| 5)?,
                    b"nvml_used_bytes" => c.opt(Cur::u64).map(|v| m.nvml_used_bytes = v).map(|_| 6)?,
                    b"rss_bytes" => c.u64().map(|v| m.rss_bytes = v).map(|_| 7)?,
                    _ => return None,
                };
                (seen & (1 << bit) == 0).then(|| seen |= 1 << bit)
            },
        )?;
        // rss_bytes is the one required figure.
        (seen & (1 << 7) != 0).then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit for bit against the standard library's correctly rounded parser.
    #[test]
    fn decimal_conversion_is_correctly_rounded() {
        let mut rng = zerobench_schema::splitmix::SplitMix64(1);
        let mut next = || rng.next_u64();
        let cases: u32 = if cfg!(debug_assertions) { 200_000 } else { 5_000_000 };
        for i in 0..cases {
            let digits = 1 + next() % 19;
            let m = next() % 10u64.pow(digits as u32);
            let e = (next() % 45) as i32 - 22;
            // Some ties and near-ties: halfway cases stress the rounding.
            let m = if i % 7 == 0 { (m | 1).wrapping_mul(5) % 10u64.pow(19) } else { m };
            let want: f64 = format!("{m}e{e}").parse().unwrap();
            let got = decimal_to_f64(m, e);
            if let Some(got) = got {
                assert_eq!(got.to_bits(), want.to_bits(), "{m}e{e}");
            } else {
                assert!(e > 0 && u128::from(m).checked_mul(10u128.pow(e as u32)).is_none(), "{m}e{e}");
            }
        }
        assert_eq!(decimal_to_f64(9_007_199_254_740_993, 0), Some(9_007_199_254_740_992.0));
        assert_eq!(decimal_to_f64(12_345_678_901_234_567, -17), Some(0.123_456_789_012_345_67));
        assert_eq!(decimal_to_f64(1, 23), None);
        // Rounding up that carries into the next power of two: 1 − 10^-19 is 1.0.
        assert_eq!(decimal_to_f64(9_999_999_999_999_999_999, -19), Some(1.0));
    }

    #[test]
    fn writer_lines_take_the_fast_path() {
        let line = br#"{"event":"step","v":2,"ts":1767225602.0992,"rank":1,"step":2,"warmup":false,"loss":8.333333333333334,"skipped":false,"tokens":32768,"samples":32,"step_ms":49.34823223709721,"forward_ms":14.804469671129162,"backward_ms":27.141527730403467,"optimizer_ms":4.934823223709721,"comm_ms":3.988447398401309,"exposed_comm_ms":1.1965342195203927,"other_ms":1.26,"overhead_ms":0.07,"comm":{"all_gather":{"calls":26,"bytes":497759232,"ms":2.6984155526211087,"max_bytes":38289171,"bus_gbps":138.3476402058889}},"memory":{"allocated_bytes":497772544,"peak_allocated_bytes":3064686592,"rss_bytes":2147491840},"power_w":642.0883637669963,"energy_j":140.61258826421272,"gpu_util_pct":95}"#;
        let s = parse_step(line).expect("fast path");
        assert_eq!((s.rank, s.step, s.tokens, s.samples), (1, 2, 32768, 32));
        assert_eq!(s.step_ms, 49.34823223709721);
        assert_eq!(s.exposed_comm_ms, 1.1965342195203927);
        assert_eq!((s.other_ms, s.overhead_ms), (1.26, 0.07));
        assert_eq!(s.energy_j, Some(140.61258826421272));
        assert_eq!(s.gpu_util_pct, Some(95));
        assert_eq!(s.memory.peak_allocated_bytes, Some(3064686592));
        let (kind, c) = s.comm.iter().next().unwrap();
        assert_eq!((kind, c.calls, c.bytes, c.ms), ("all_gather", 26, 497759232, 2.6984155526211087));
        // Refused, for the schema's parser to judge: a space, an unknown key.
        for bad in [&b"{\"event\":\"step\",\"v\":2, \"rank\":1}"[..], b"{\"event\":\"step\",\"v\":2,\"x\":1}"] {
            assert!(parse_step(bad).is_none());
        }
        let text = String::from_utf8_lossy(line);
        let edits = [
            // A duplicate key, a leading zero.
            ("\"rank\":1,", "\"rank\":1,\"rank\":1,"),
            ("\"tokens\":32768", "\"tokens\":032768"),
            // A number past u64 in a field that is one; a duplicate key in the memory sample.
            ("\"tokens\":32768", "\"tokens\":99999999999999999999"),
            ("\"rss_bytes\":2147491840", "\"rss_bytes\":2147491840,\"rss_bytes\":1"),
            // A key left open: the name, one more byte and the colon.
            ("\"rank\":1,", "\"rankX:1,"),
            // Bytes just past '9' after digits: not digits, however eight of them are read.
            ("\"tokens\":32768", "\"tokens\":9999999;;"),
            // Fields the schema requires though ingest does not use them.
            ("\"ts\":1767225602.0992,", ""),
            ("\"warmup\":false,", ""),
            ("\"skipped\":false,", ""),
            (",\"max_bytes\":38289171", ""),
            (",\"rss_bytes\":2147491840", ""),
            ("\"rss_bytes\":2147491840", "\"rss_bytes\":null"),
            // Unused values that do not fit their type.
            ("\"ts\":1767225602.0992", "\"ts\":1e400"),
            ("\"gpu_util_pct\":95", "\"gpu_util_pct\":9.5"),
            ("\"max_bytes\":38289171", "\"max_bytes\":-1"),
            // A kind named twice.
            ("\"comm\":{", "\"comm\":{\"all_gather\":{\"calls\":1,\"bytes\":1,\"ms\":1,\"max_bytes\":1},"),
        ];
        for (from, to) in edits {
            let bad = text.replacen(from, to, 1);
            assert_ne!(bad, text);
            assert!(parse_step(bad.as_bytes()).is_none(), "{bad}");
        }
        // Keys in another order, and a negative value in a field the scan skips: read in place,
        // to the same values.
        let swapped = text.replacen("\"rank\":1,\"step\":2,", "\"step\":2,\"rank\":1,", 1);
        let negative = text.replacen("\"ts\":1767225602.0992", "\"ts\":-1.5", 1);
        for other in [swapped, negative] {
            assert_ne!(other, text);
            let s = parse_step(other.as_bytes()).unwrap_or_else(|| panic!("fast path refused {other}"));
            assert_eq!((s.rank, s.step, s.step_ms), (1, 2, 49.34823223709721), "{other}");
        }
        // An unused number past an f64's range by its digits alone (10^309 written out): refused.
        let huge = text.replacen("\"ts\":1767225602.0992", &format!("\"ts\":1{}", "0".repeat(309)), 1);
        assert!(parse_step(huge.as_bytes()).is_none());
        // A negative figure that is read: the loss.
        let negative_loss = text.replacen("\"loss\":8.333333333333334", "\"loss\":-2.5", 1);
        assert_eq!(parse_step(negative_loss.as_bytes()).map(|s| s.loss), Some(Some(-2.5)));
        // An exponent, as serde_json writes small figures.
        let small = text.replacen("\"loss\":8.333333333333334", "\"loss\":1.5e-7", 1);
        assert_eq!(parse_step(small.as_bytes()).map(|s| s.loss), Some(Some(1.5e-7)));
        // A loss that was not finite is written `null`: read, as none.
        let null_loss = text.replacen("\"loss\":8.333333333333334", "\"loss\":null", 1);
        assert_eq!(parse_step(null_loss.as_bytes()).map(|s| s.loss), Some(None));
        // Twenty significant digits, more than a u64 holds: still the correctly rounded value.
        let long = text.replacen("\"step_ms\":49.34823223709721", "\"step_ms\":9999999999999999.9999", 1);
        assert_eq!(parse_step(long.as_bytes()).map(|s| s.step_ms), Some(1e16));
        // Twelve digits before the point and eight after: twenty, read without overflow.
        let wide = text.replacen("\"step_ms\":49.34823223709721", "\"step_ms\":999999999999.99999999", 1);
        assert_eq!(parse_step(wide.as_bytes()).map(|s| s.step_ms), Some(999_999_999_999.999_999_99));
        // Without the comm map, without the memory sample.
        for (cut, closing) in [(",\"comm\":{", "}}"), (",\"memory\":{", "}")] {
            let at = text.find(cut).unwrap();
            let end = at + text[at..].find(closing).unwrap() + closing.len();
            let bad = format!("{}{}", &text[..at], &text[end..]);
            assert!(parse_step(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    /// Eight bytes are a word of digits exactly when each is '0' to '9': every byte value in
    /// every place of an otherwise valid word.
    #[test]
    fn eight_digits_takes_digits_only() {
        let mut word = *b"12345678";
        for place in 0..8 {
            for b in 0..=255u8 {
                word[place] = b;
                let cur = Cur { b: &word, i: 0 };
                assert_eq!(cur.eight_digits().is_some(), b.is_ascii_digit(), "byte {b:#04x} in place {place}");
            }
            word[place] = b'1' + place as u8;
        }
        assert_eq!(eight_digit_value(Cur { b: b"12345678", i: 0 }.eight_digits().unwrap()), 12_345_678);
    }
}
