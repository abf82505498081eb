//! Splitting a byte range of a file into lines, with bounded memory.
//!
//! Blocks are read into one reused buffer and every complete line is handed out as a slice of it,
//! so the common case copies nothing. A line longer than the limit is not accumulated: the splitter
//! skips to its end and reports its length instead, so a binary file without newlines costs one
//! block of memory, not its size.
//!
//! Byte ranges follow the usual split rule: a range `[start, end)` owns every line whose first byte
//! lies in it. A reader that starts in the middle of a line skips to the next one (the previous
//! range owns it), and a reader reads past `end` to finish its last line. Ranges that tile a file
//! therefore see every line exactly once, whatever the cut points. A UTF-8 byte-order mark at the
//! start of the file is left out of its first line.

use std::io::{self, Read, Seek, SeekFrom};
use std::ops::ControlFlow;

/// The longest line kept. Worker records are well under 4 KiB; a start record with a long
/// configuration is still far below this.
pub const MAX_LINE: usize = 1 << 20;

/// UTF-8's byte-order mark, which some tools write at the start of a text file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// Block size of each read for bulk reading.
pub const BLOCK: usize = 1 << 20;

/// One line as the splitter saw it.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A complete line without its `\n` (a trailing `\r` is removed too).
    Full(&'a [u8]),
    /// The file ended without a newline: what was there (a writer killed mid-line, or a file that
    /// simply lacks the final newline).
    Unterminated(&'a [u8]),
    /// Longer than the limit: skipped, and this is how many bytes it had.
    TooLong(u64),
}

/// Calls `f` with every line whose first byte lies in `[start, end)`, with its 1-based number
/// counted from the first line of the range, until `f` breaks. Reads `block` bytes at a time.
/// Returns the number of lines seen.
pub fn for_each_line<R, F>(src: R, start: u64, end: u64, max_line: usize, block: usize, f: F) -> io::Result<u64>
where
    R: Read + Seek,
    F: FnMut(u64, Line<'_>) -> ControlFlow<()>,
{
    let mut win = Window::new(block.max(1).min(max_line) + block.max(1));
    for_each_line_in(&mut win, src, start, end, max_line, block, f)
}

/// [`for_each_line`] with a window the caller keeps, so that a thread reading many ranges
/// allocates (and zeroes) its buffer once.
pub fn for_each_line_in<R, F>(
    win: &mut Window,
    mut src: R,
    start: u64,
    end: u64,
    max_line: usize,
    block: usize,
    mut f: F,
) -> io::Result<u64>
where
    R: Read + Seek,
    F: FnMut(u64, Line<'_>) -> ControlFlow<()>,
{
    let block = block.max(1);
    win.clear();
    let mut pos = start;
    if start > 0 {
        // The byte before `start` tells whether `start` begins a line; if not, the line running
        // through `start` belongs to the previous range.
        src.seek(SeekFrom::Start(start - 1))?;
        pos = start - 1;
        loop {
            win.clear();
            if win.fill(&mut src, block)? == 0 {
                return Ok(0);
            }
            match memchr::memchr(b'\n', win.data()) {
                Some(i) => {
                    pos += i as u64 + 1;
                    win.consume(i + 1);
                    break;
                }
                None => pos += win.data().len() as u64,
            }
        }
    } else {
        src.seek(SeekFrom::Start(0))?;
        // A byte-order mark (an editor's or a Windows tool's) is not part of the first line.
        while win.data().len() < UTF8_BOM.len() && win.fill(&mut src, block)? > 0 {}
        if win.data().starts_with(UTF8_BOM) {
            win.consume(UTF8_BOM.len());
            pos = UTF8_BOM.len() as u64;
        }
    }

    let mut lines = 0u64;
    // The window holds bytes from file offset `pos` on; `skipping` is set while inside an
    // over-long line, with the number of its bytes seen so far.
    let mut skipping: Option<u64> = None;
    loop {
        // Hand out every complete line in the window.
        let data = win.data();
        let mut at = 0usize;
        while let Some(i) = memchr::memchr(b'\n', &data[at..]) {
            if pos >= end && skipping.is_none() {
                return Ok(lines);
            }
            let line = &data[at..at + i];
            lines += 1;
            let flow = match skipping.take() {
                Some(seen) => f(lines, Line::TooLong(seen + i as u64)),
                None if line.len() > max_line => f(lines, Line::TooLong(line.len() as u64)),
                None => f(lines, Line::Full(strip_cr(line))),
            };
            at += i + 1;
            pos += i as u64 + 1;
            if flow.is_break() {
                return Ok(lines);
            }
        }
        if pos >= end && skipping.is_none() {
            return Ok(lines);
        }
        // Keep the incomplete tail, unless it is already too long to keep.
        let tail = (data.len() - at) as u64;
        if let Some(seen) = skipping.as_mut() {
            *seen += tail;
            pos += tail;
            win.clear();
        } else if tail > max_line as u64 {
            skipping = Some(tail);
            pos += tail;
            win.clear();
        } else {
            win.consume(at);
        }
        if win.fill(&mut src, block)? == 0 {
            // End of file: what is left is a last line without a newline.
            if let Some(seen) = skipping {
                lines += 1;
                let _ = f(lines, Line::TooLong(seen));
            } else if !win.data().is_empty() {
                lines += 1;
                let _ = f(lines, Line::Unterminated(strip_cr(win.data())));
            }
            return Ok(lines);
        }
    }
}

/// A read buffer allocated and zeroed once, holding the bytes `buf[lo..hi]`: reads go straight
/// into its spare room, so no block is zeroed or copied more than once.
#[derive(Debug, Default)]
pub struct Window {
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
}

impl Window {
    pub fn new(capacity: usize) -> Self {
        Window { buf: vec![0; capacity], lo: 0, hi: 0 }
    }

    fn data(&self) -> &[u8] {
        &self.buf[self.lo..self.hi]
    }

    fn consume(&mut self, n: usize) {
        self.lo += n;
    }

    fn clear(&mut self) {
        self.lo = 0;
        self.hi = 0;
    }

    /// Moves what is held to the front and reads up to `block` more bytes after it, retrying on
    /// interruption; returns how many came.
    fn fill<R: Read>(&mut self, src: &mut R, block: usize) -> io::Result<usize> {
        if self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        if self.buf.len() < self.hi + block {
            self.buf.resize(self.hi + block, 0);
        }
        loop {
            match src.read(&mut self.buf[self.hi..self.hi + block]) {
                Ok(n) => {
                    self.hi += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn collect(data: &[u8], start: u64, end: u64, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        // A tiny block size exercises lines that straddle reads.
        for_each_line(Cursor::new(data), start, end, max, 3, |n, l| {
            out.push(match l {
                Line::Full(b) => format!("{n}:{}", String::from_utf8_lossy(b)),
                Line::Unterminated(b) => format!("{n}:partial:{}", String::from_utf8_lossy(b)),
                Line::TooLong(k) => format!("{n}:toolong:{k}"),
            });
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    #[test]
    fn whole_file() {
        assert_eq!(collect(b"a\nbb\r\n\nc", 0, u64::MAX, 10), ["1:a", "2:bb", "3:", "4:partial:c"]);
        assert_eq!(collect(b"", 0, u64::MAX, 10), Vec::<String>::new());
        assert_eq!(collect(b"a\n", 0, u64::MAX, 10), ["1:a"]);
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_line() {
        assert_eq!(collect(b"\xEF\xBB\xBFa\nb\n", 0, u64::MAX, 10), ["1:a", "2:b"]);
        for block in [1, 2] {
            let mut lines = Vec::new();
            for_each_line(Cursor::new(b"\xEF\xBB\xBFa\n"), 0, u64::MAX, 10, block, |_, l| {
                lines.push(format!("{l:?}"));
                ControlFlow::Continue(())
            })
            .unwrap();
            assert_eq!(lines, ["Full([97])"], "reads of {block} bytes");
        }
        // Only at the start of the file.
        assert_eq!(collect(b"a\n\xEF\xBB\xBFb\n", 0, u64::MAX, 10), ["1:a", "2:\u{feff}b"]);
        assert_eq!(collect(b"\xEF\xBB\xBF", 0, u64::MAX, 10), Vec::<String>::new());
        // A range after the first does not see the mark's bytes as a line start.
        assert_eq!(collect(b"\xEF\xBB\xBFaa\nb\n", 2, u64::MAX, 10), ["1:b"]);
        let halves = [collect(b"\xEF\xBB\xBFaa\nb\n", 0, 4, 10), collect(b"\xEF\xBB\xBFaa\nb\n", 4, u64::MAX, 10)];
        assert_eq!(halves.concat(), ["1:aa", "1:b"]);
    }

    #[test]
    fn long_lines_are_skipped_not_kept() {
        assert_eq!(collect(b"abcdef\nab\nabcdefgh", 0, u64::MAX, 4), ["1:toolong:6", "2:ab", "3:toolong:8"]);
        // An over-long line whose newline comes inside a later read counts all of its bytes.
        assert_eq!(collect(b"abcdefgh\nab\n", 0, u64::MAX, 4), ["1:toolong:8", "2:ab"]);
    }

    #[test]
    fn ranges_tile_the_file() {
        let data = b"one\ntwo\nthree\n\nfive\nsix";
        for cut in 0..=data.len() as u64 {
            let a = collect(data, 0, cut, 100);
            let b = collect(data, cut, u64::MAX, 100);
            let joined: Vec<String> =
                a.iter().chain(b.iter()).map(|s| s.split_once(':').unwrap().1.to_string()).collect();
            assert_eq!(joined, ["one", "two", "three", "", "five", "partial:six"], "cut at {cut}");
        }
        // Three ranges, the middle one starting inside lines longer than a read.
        for a in 0..=data.len() as u64 {
            for b in a..=data.len() as u64 {
                let parts = [collect(data, 0, a, 100), collect(data, a, b, 100), collect(data, b, u64::MAX, 100)];
                let joined: Vec<String> =
                    parts.iter().flatten().map(|s| s.split_once(':').unwrap().1.to_string()).collect();
                assert_eq!(joined, ["one", "two", "three", "", "five", "partial:six"], "cuts at {a} and {b}");
            }
        }
    }

    /// Over-long lines at the start, in the middle and at the end of a file: two ranges cut
    /// anywhere still see each line once, the skipped ones with all of their bytes.
    #[test]
    fn ranges_tile_a_file_of_long_lines() {
        let data = b"abcdefghij\nab\nabcdefgh\ncd\nefghijklm";
        for cut in 0..=data.len() as u64 {
            let parts = [collect(data, 0, cut, 4), collect(data, cut, u64::MAX, 4)];
            let joined: Vec<String> =
                parts.iter().flatten().map(|s| s.split_once(':').unwrap().1.to_string()).collect();
            assert_eq!(joined, ["toolong:10", "ab", "toolong:8", "cd", "toolong:9"], "cut at {cut}");
        }
    }

    /// The window holds at most one line and one read: reading a file of many lines does not
    /// grow it with the file.
    #[test]
    fn the_window_does_not_grow_with_the_file() {
        let data: Vec<u8> = (0..2000).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
        let (max_line, block) = (100, 64);
        let mut win = Window::new(max_line + block);
        let lines = for_each_line_in(&mut win, Cursor::new(&data), 0, u64::MAX, max_line, block, |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(lines, 2000);
        assert!(win.buf.len() <= max_line + block, "{} bytes held", win.buf.len());
    }

    /// A read interrupted by a signal is tried again; any other error ends the reading with it.
    #[test]
    fn interrupted_reads_are_retried_and_errors_returned() {
        struct Flaky<R> {
            inner: R,
            fail: Option<io::ErrorKind>,
        }
        impl<R: Read> Read for Flaky<R> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                match self.fail {
                    Some(io::ErrorKind::Interrupted) => {
                        self.fail = None;
                        Err(io::ErrorKind::Interrupted.into())
                    }
                    Some(kind) => Err(kind.into()),
                    None => self.inner.read(buf),
                }
            }
        }
        impl<R: Seek> Seek for Flaky<R> {
            fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
                self.inner.seek(pos)
            }
        }
        let read = |fail| {
            let src = Flaky { inner: Cursor::new(b"a\nb\n".to_vec()), fail: Some(fail) };
            for_each_line(src, 0, u64::MAX, 10, 4, |_, _| ControlFlow::Continue(()))
        };
        assert_eq!(read(io::ErrorKind::Interrupted).unwrap(), 2);
        assert_eq!(read(io::ErrorKind::PermissionDenied).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }

    /// A line of exactly the limit is kept, also when a read ends right after its last byte.
    #[test]
    fn a_line_at_the_limit_is_kept() {
        let mut got = Vec::new();
        for_each_line(Cursor::new(b"abcd\nab\n"), 0, u64::MAX, 4, 4, |_, l| {
            got.push(matches!(l, Line::Full(b) if b.len() <= 4));
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(got, [true, true]);
    }
}
