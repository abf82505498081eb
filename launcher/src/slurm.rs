//! Running the Slurm client commands (and other helpers) with a deadline, so that a controller
//! that does not answer turns into an error instead of a hang.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::Error;

/// How long a Slurm client command may take. sbatch retries an unreachable controller for about
/// 18 s before it gives up, so this leaves it room to say so itself.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// What a finished command printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

/// The command line as text, for messages.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

/// Runs `cmd` to completion or until `timeout`, when it is killed. Standard input is closed.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Output, Error> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Command { command: what.clone(), message: format!("cannot start: {e}") })?;
    // Drain both pipes on threads so a chatty command cannot block on a full pipe.
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_string(&mut s);
        }
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_string(&mut s);
        }
        s
    });
    let status = match wait_until(&mut child, Some(Instant::now() + timeout), Duration::from_millis(20)) {
        Ok(Some(st)) => st,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Command {
                command: what,
                message: format!("no answer within {} s; killed", timeout.as_secs()),
            });
        }
        Err(e) => return Err(Error::Command { command: what, message: e.to_string() }),
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    Ok(Output { code: status.code().unwrap_or(-1), stdout, stderr })
}

/// Checks on `child` every `every` until it exits, giving its status, or `deadline` passes, giving
/// `None`; without a deadline it waits as long as the child runs.
pub(crate) fn wait_until(
    child: &mut Child,
    deadline: Option<Instant>,
    every: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        std::thread::sleep(every);
    }
}

/// Runs `cmd` and insists on exit code 0.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> Result<Output, Error> {
    let what = describe(cmd);
    let out = run(cmd, timeout)?;
    if !out.ok() {
        return Err(Error::Slurm { command: what, code: out.code, stderr: out.stderr.trim().to_string() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_codes() {
        let out =
            run(Command::new("sh").args(["-c", "echo hi; echo err >&2; exit 3"]), Duration::from_secs(10)).unwrap();
        assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (3, "hi\n", "err\n"));
        let e = run_ok(Command::new("sh").args(["-c", "exit 1"]), Duration::from_secs(10)).unwrap_err();
        assert!(matches!(e, Error::Slurm { code: 1, .. }));
    }

    /// A command killed by a signal has no exit code: -1, never a code it could have exited with.
    #[test]
    fn a_command_killed_by_a_signal_gives_code_minus_one() {
        let out = run(Command::new("sh").args(["-c", "kill -9 $$"]), Duration::from_secs(10)).unwrap();
        assert_eq!(out.code, -1);
        assert!(!out.ok());
        assert!(run_ok(&mut Command::new("true"), Duration::from_secs(10)).unwrap().ok());
    }

    #[test]
    fn messages_name_the_command_line() {
        assert_eq!(describe(Command::new("sbatch").args(["--parsable", "job.sbatch"])), "sbatch --parsable job.sbatch");
        let e = run_ok(Command::new("sh").args(["-c", "echo no >&2; exit 2"]), Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("sh -c echo no >&2; exit 2"), "{e}");
    }

    #[test]
    fn a_hanging_command_is_killed() {
        let t = Instant::now();
        let e = run(Command::new("sleep").arg("30"), Duration::from_millis(300)).unwrap_err();
        assert!(e.to_string().contains("no answer within"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(run(&mut Command::new("/nonexistent/zb"), Duration::from_secs(1))
            .unwrap_err()
            .to_string()
            .contains("cannot start"));
    }
}
