//! What the ranks settle among themselves before any of them works: that all were started with
//! the same configuration, and that every rank's device and log opened.
//!
//! Each rank checks its own flags, device and log. A rank that alone found a fault and stopped
//! would leave the others waiting in their first collective until the stall limit (300 s before
//! the first step), and ranks started with different flags (an MPMD launch, a script that edits
//! one rank's line) would train different models against each other, or hang. After these
//! small exchanges over the host group (an 8-byte digest, then a byte per rank and step), every
//! rank stops at once with the same exit code, and a log folder an earlier run left keeps only
//! its own files.

use std::path::Path;

use serde_json::Value;
use zerobench_schema::fnv::fnv1a;
use zerobench_schema::RunConfig;

use crate::comm::group::HostGroup;
use crate::failure::{Failure, Refused};
use crate::logfile::{LogError, RankLog};

/// Every rank's configuration is rank 0's, or all ranks fail with [`Refused::RanksDisagree`]
/// (exit code 2), which names the first field that differs on the ranks whose own differs.
pub fn same_configuration(host: &mut HostGroup, cfg: &RunConfig) -> Result<(), Failure> {
    let mine = serde_json::to_value(cfg).map_err(|e| Failure::Internal(format!("the configuration as JSON: {e}")))?;
    let text = mine.to_string();
    let digests = host.all_gather_bytes(&fnv1a(text.as_bytes()).to_le_bytes())?;
    let ranks: Vec<u32> = (1..digests.len()).filter(|&r| digests[r] != digests[0]).map(|r| r as u32).collect();
    if ranks.is_empty() {
        return Ok(());
    }
    // Rank 0's configuration, so that the ranks whose own differs can name the field.
    let mut len = (text.len() as u64).to_le_bytes();
    host.broadcast_bytes(&mut len, 0)?;
    let len = usize::try_from(u64::from_le_bytes(len))
        .map_err(|_| Failure::Internal("rank 0's configuration is longer than this host can hold".into()))?;
    let mut theirs = vec![0u8; len];
    if host.rank() == 0 {
        theirs.copy_from_slice(text.as_bytes());
    }
    host.broadcast_bytes(&mut theirs, 0)?;
    let theirs: Value = serde_json::from_slice(&theirs)
        .map_err(|e| Failure::Internal(format!("rank 0's configuration as JSON: {e}")))?;
    Err(Refused::RanksDisagree { ranks, field: first_difference(&theirs, &mine, "") }.into())
}

/// The path (`engine.hpz`) of the first field, in key order, where `a` and `b` differ; `None` when
/// they are equal.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => first_difference(u, v, &path),
                    _ => Some(path),
                }
            })
        }
        _ if a == b => None,
        _ => Some(at.to_string()),
    }
}

/// Every rank's `mine` succeeded, or every rank fails: the rank whose step failed with its own
/// error, the others with the first failed rank's number and its class (the same exit code).
/// `what` says what the step does (`open its device`). On a rank whose step succeeded while
/// another's failed, `undo` gets the value back (a log to remove).
pub fn all_succeed<T>(
    host: &mut HostGroup,
    mine: Result<T, Failure>,
    what: &str,
    undo: impl FnOnce(T),
) -> Result<T, Failure> {
    // Each rank's exit code, 0 where its step succeeded.
    let code = mine.as_ref().err().map_or(0, |f| u8::try_from(f.exit_code()).unwrap_or(1));
    let codes = host.all_gather_bytes(&[code])?;
    let failed = codes.iter().enumerate().find_map(|(r, c)| c.first().filter(|&&c| c != 0).map(|&c| (r, c)));
    match (mine, failed) {
        (Err(e), _) => Err(e),
        (Ok(v), Some((rank, code))) => {
            undo(v);
            let why = format!("rank {rank} could not {what}; no rank ran");
            Err(match code {
                2 => Refused::Peer(why).into(),
                3 => Failure::Oom { message: why, requested_bytes: None },
                4 => Failure::Comm(why),
                5 => Failure::Io(why),
                _ => Failure::Internal(why),
            })
        }
        (Ok(v), None) => Ok(v),
    }
}

/// The longest GPU name [`same_placement`] exchanges (`GPU-` and a 36-character UUID).
const UUID_BYTES: usize = 40;

/// Every rank computes on the same kind of device, and no two ranks on one GPU: with `--device
/// auto` a rank that finds no GPU (a second rank on a host with one) computes on the CPU, and
/// its collectives (MPI) never meet the others' (NCCL); two ranks on one GPU hang in NCCL's
/// first collective. Both waited for the stall limit (300 s, exit 4); now every rank is refused
/// at once (exit 2). `gpu` is this rank's GPU's UUID (empty where the driver did not say), `None`
/// on the CPU.
pub fn same_placement(host: &mut HostGroup, gpu: Option<&str>) -> Result<(), Failure> {
    let mut mine = [0u8; UUID_BYTES + 1];
    if let Some(uuid) = gpu {
        mine[0] = 1;
        let n = uuid.len().min(UUID_BYTES);
        mine[1..=n].copy_from_slice(&uuid.as_bytes()[..n]);
    }
    let all = host.all_gather_bytes(&mine)?;
    let placed: Vec<Option<String>> = all
        .iter()
        .map(|b| {
            (b[0] == 1).then(|| {
                let end = b[1..].iter().position(|&c| c == 0).unwrap_or(UUID_BYTES);
                String::from_utf8_lossy(&b[1..=end]).into_owned()
            })
        })
        .collect();
    match placement_conflict(&placed) {
        Some(why) => Err(Refused::Peer(why).into()),
        None => Ok(()),
    }
}

/// Why ranks placed on `placed` (each rank's GPU, `None` on the CPU) cannot run together.
fn placement_conflict(placed: &[Option<String>]) -> Option<String> {
    let ranks = |on_gpu: bool| -> Vec<String> {
        placed.iter().enumerate().filter(|(_, p)| p.is_some() == on_gpu).map(|(r, _)| r.to_string()).collect()
    };
    let (gpu, cpu) = (ranks(true), ranks(false));
    if !gpu.is_empty() && !cpu.is_empty() {
        return Some(format!(
            "rank(s) {} compute on a GPU and rank(s) {} on the CPU (--device auto found no GPU there); \
             every rank needs a GPU of its own, or run all with --device cpu",
            gpu.join(", "),
            cpu.join(", ")
        ));
    }
    for (a, pa) in placed.iter().enumerate() {
        let Some(uuid) = pa.as_deref().filter(|u| !u.is_empty()) else { continue };
        if let Some(b) = placed.iter().skip(a + 1).position(|pb| pb.as_deref() == Some(uuid)) {
            return Some(format!(
                "ranks {a} and {} share GPU {uuid}; every rank needs a GPU of its own (start as many ranks per \
                 host as it has GPUs)",
                a + 1 + b
            ));
        }
    }
    None
}

/// Every rank's log opened, or none is kept ([`all_succeed`]): the ranks whose log opened remove
/// the empty file. With `overwrite`, rank 0 then removes the logs of ranks this run does not have
/// (`rank<N>.jsonl`, N ≥ the world size), which an earlier, larger run left and which would
/// otherwise be read as part of this one.
pub fn logs_opened(
    host: &mut HostGroup,
    mine: Result<RankLog, LogError>,
    dir: &Path,
    overwrite: bool,
) -> Result<RankLog, Failure> {
    let mine = mine.map_err(|e| Failure::Io(e.to_string()));
    // Best effort: the run stops either way, and the file holds nothing.
    let log = all_succeed(host, mine, &format!("open its log in {}", dir.display()), |log: RankLog| {
        let _ = log.discard();
    })?;
    if overwrite && host.rank() == 0 {
        RankLog::remove_beyond(dir, host.size())
            .map_err(|e| Failure::Io(format!("removing an earlier run's logs from {}: {e}", dir.display())))?;
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{first_difference, placement_conflict};

    #[test]
    fn ranks_on_mixed_devices_or_one_gpu_are_named() {
        let gpu = |u: &str| Some(format!("GPU-{u}"));
        assert_eq!(placement_conflict(&[None, None]), None);
        assert_eq!(placement_conflict(&[gpu("a"), gpu("b")]), None);
        let mixed = placement_conflict(&[gpu("a"), None, gpu("b"), None]).unwrap();
        assert!(mixed.starts_with("rank(s) 0, 2 compute on a GPU and rank(s) 1, 3 on the CPU"), "{mixed}");
        let shared = placement_conflict(&[gpu("a"), gpu("b"), gpu("a")]).unwrap();
        assert!(shared.starts_with("ranks 0 and 2 share GPU GPU-a"), "{shared}");
        // GPUs whose UUID the driver did not give are not taken for one.
        assert_eq!(placement_conflict(&[Some(String::new()), Some(String::new())]), None);
    }

    #[test]
    fn the_first_differing_field_is_named_by_its_path() {
        let a = json!({"model": "tiny", "seq_len": 16, "engine": {"hpz": null, "bucket_mb": 25}});
        assert_eq!(first_difference(&a, &a, ""), None);
        let b = json!({"model": "tiny", "seq_len": 32, "engine": {"hpz": null, "bucket_mb": 25}});
        assert_eq!(first_difference(&a, &b, "").as_deref(), Some("seq_len"));
        let c = json!({"model": "tiny", "seq_len": 16, "engine": {"hpz": 2, "bucket_mb": 25}});
        assert_eq!(first_difference(&a, &c, "").as_deref(), Some("engine.hpz"));
        // In key order: `engine` comes before `seq_len`.
        let d = json!({"model": "tiny", "seq_len": 32, "engine": {"hpz": 2, "bucket_mb": 25}});
        assert_eq!(first_difference(&a, &d, "").as_deref(), Some("engine.hpz"));
        // A field one side lacks.
        let e = json!({"model": "tiny", "seq_len": 16, "engine": {"hpz": null, "bucket_mb": 25}, "data": "x"});
        assert_eq!(first_difference(&a, &e, "").as_deref(), Some("data"));
    }
}
