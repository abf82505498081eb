//! Standard output whose write errors name it. Written through `std::io::stdout()` directly, a
//! table sent to a full disk (`zerobench plan spec.yaml > /full/disk/plan.txt`) ended with only
//! "No space left on device", which names no file.

use std::io::{self, Write};

/// The process's standard output, locked.
pub struct Stdout(io::StdoutLock<'static>);

/// Locks standard output for writing.
pub fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

/// The error, its kind kept (a closed pipe is still `BrokenPipe`, an interrupted write still
/// `Interrupted` and retried by `write_all`), its message naming where the write went.
fn named(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("writing standard output: {e}"))
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).map_err(named)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(named)
    }
}
