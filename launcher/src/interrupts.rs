//! SIGINT, SIGTERM and SIGHUP caught instead of ending the process, for as long as a sweep is
//! under way: `local` stops the run going and records it cancelled, `submit` stops between two
//! submissions with every job it sent recorded. Either then reports the signal by name.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::error::Error;

/// The signals caught while held; released (their handlers unregistered) when dropped.
pub struct Held {
    /// The last signal that came, 0 while none has.
    pub signal: Arc<AtomicUsize>,
    ids: Vec<signal_hook::SigId>,
}

impl Held {
    pub fn hold() -> Result<Self, Error> {
        let signal = Arc::new(AtomicUsize::new(0));
        let mut ids = Vec::new();
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            let id = signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)
                .map_err(|e| Error::io(Path::new("signal handler"), e))?;
            ids.push(id);
        }
        Ok(Held { signal, ids })
    }

    /// The signal's name, if one came.
    pub fn received(&self) -> Option<String> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(name(sig)),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// A signal's name as records and messages give it.
pub fn name(sig: usize) -> String {
    match sig as libc::c_int {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        SIGHUP => "SIGHUP".into(),
        other => format!("signal {other}"),
    }
}
