//! Why a run stopped early, as the `error` record's class and the process exit code.
//!
//! | exit code | class | meaning |
//! |---|---|---|
//! | 0 | — | the run completed |
//! | 1 | internal | a bug or an unexpected library error |
//! | 2 | config | invalid flags or combination, rejected before any work (clap uses 2 for usage errors too) |
//! | 3 | oom | out of device or host memory: the configuration does not fit |
//! | 4 | comm | a collective failed (a peer died, the network broke) |
//! | 5 | io | the log or data could not be read or written |

use tch::TchError;
use zerobench_schema::log::ErrorClass;
use zerobench_schema::ConfigError;

use crate::comm::CommError;
use crate::runtime::cpus::CpuError;
use crate::runtime::device::DeviceError;
use crate::runtime::launch_env;
use crate::runtime::pinned::PinError;
use crate::runtime::rendezvous::JoinError;
use crate::zero::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Config(#[from] Refused),
    #[error("{0}")]
    Io(String),
    #[error("out of memory: {message}")]
    Oom { message: String, requested_bytes: Option<u64> },
    #[error("communication failed: {0}")]
    Comm(String),
    #[error("{0}")]
    Internal(String),
}

/// Why a run is refused before any training: its configuration, or how it was launched.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// A rule of `RunConfig::validate`, the launcher's too.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error("--threads {threads} is more than 4 per core of this host ({most}): the threads would only contend")]
    Threads { threads: u32, most: usize },
    #[error("invalid --model: {0}")]
    Model(String),
    /// A `--launch-cpu` this rank may not run on.
    #[error(transparent)]
    LaunchCpu(CpuError),
    #[error("--launch-cpu {0} places the threads that launch a GPU's work, and this run has no GPU")]
    LaunchCpuWithoutGpu(usize),
    /// The launch's flags or environment (not the ranks failing to reach each other).
    #[error(transparent)]
    Launch(JoinError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A GPU rank whose launcher's local rank is not its rank among its host's ranks.
    #[error(
        "the launcher gave {} ({}), but this is rank {local_rank} of the {local_size} ranks on its host: cannot \
         pick this rank's GPU",
        hint.map_or_else(|| "no local rank".to_string(), |l| format!("local rank {l}")),
        launch_env::LOCAL_RANK
    )]
    LocalRank { hint: Option<u32>, local_rank: u32, local_size: u32 },
    #[error("--copy-engines moves data between GPUs, and this run has none")]
    CopyEnginesWithoutGpu,
    #[error("--cuda-graph replays GPU work, and this run found no GPU")]
    CudaGraphWithoutGpu,
    #[error("--profile-step {step} is past the run's last step, {} (--steps {steps} counts from 0)", steps.saturating_sub(1))]
    ProfileStepPastRun { step: u32, steps: u32 },
    /// Ranks started with other flags than rank 0's (`crate::agree`); `field` is named on the
    /// ranks whose own configuration differs.
    #[error(
        "rank(s) {} started with other flags than rank 0{}; start every rank with the same flags",
        ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        field.as_deref().map(|f| format!(" (this rank's `{f}` differs)")).unwrap_or_default()
    )]
    RanksDisagree { ranks: Vec<u32>, field: Option<String> },
    /// A refusal that names other ranks (`crate::agree`): one of them was refused before any
    /// work, or the ranks were placed where they cannot run together.
    #[error("{0}")]
    Peer(String),
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Config(Refused::Invalid(e))
    }
}

/// A step that could not be captured or replayed (`--cuda-graph`).
impl From<crate::runtime::graph::GraphError> for Failure {
    fn from(e: crate::runtime::graph::GraphError) -> Self {
        Failure::Internal(format!("--cuda-graph: {e}"))
    }
}

impl Failure {
    pub fn class(&self) -> ErrorClass {
        match self {
            Failure::Config(_) => ErrorClass::Config,
            Failure::Io(_) => ErrorClass::Io,
            Failure::Oom { .. } => ErrorClass::Oom,
            Failure::Comm(_) => ErrorClass::Comm,
            Failure::Internal(_) => ErrorClass::Internal,
        }
    }

    pub fn exit_code(&self) -> i32 {
        match self {
            Failure::Internal(_) => 1,
            Failure::Config(_) => 2,
            Failure::Oom { .. } => 3,
            Failure::Comm(_) => 4,
            Failure::Io(_) => 5,
        }
    }

    /// Classifies a libtorch error: allocation failures are OOM, the rest internal.
    pub fn from_torch_message(msg: &str) -> Failure {
        let lower = msg.to_ascii_lowercase();
        if lower.contains("out of memory")
            || lower.contains("can't allocate memory")
            || lower.contains("not enough memory")
            // The C++ allocator's exception (a host tensor past what the process may map).
            || lower.contains("std::bad_alloc")
        {
            Failure::Oom { message: first_line(msg), requested_bytes: requested_bytes(msg) }
        } else {
            Failure::Internal(first_line(msg))
        }
    }
}

fn first_line(msg: &str) -> String {
    msg.lines().next().unwrap_or("").to_string()
}

/// The size in PyTorch's "Tried to allocate 2.00 GiB" or the CPU allocator's
/// "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123 bytes".
fn requested_bytes(msg: &str) -> Option<u64> {
    if let Some(rest) = msg.split("Tried to allocate ").nth(1) {
        let mut it = rest.split_whitespace();
        let value: f64 = it.next()?.parse().ok()?;
        let unit = it.next()?.trim_end_matches(['.', ',', ';']);
        let mult = match unit {
            "B" | "bytes" => 1.0,
            "KiB" => 1024.0,
            "MiB" => 1024.0 * 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            "TiB" => 1024.0f64.powi(4),
            _ => return None,
        };
        return Some((value * mult) as u64);
    }
    let rest = msg.split("you tried to allocate ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

impl From<TchError> for Failure {
    fn from(e: TchError) -> Self {
        Failure::from_torch_message(&e.to_string())
    }
}

impl From<crate::data::BatchError> for Failure {
    fn from(e: crate::data::BatchError) -> Self {
        match e {
            crate::data::BatchError::Torch(t) => t.into(),
            crate::data::BatchError::HostMemory { bytes } => {
                Failure::Oom { message: e.to_string(), requested_bytes: Some(bytes) }
            }
        }
    }
}

impl From<crate::metrics::clock::ClockError> for Failure {
    fn from(e: crate::metrics::clock::ClockError) -> Self {
        Failure::Internal(e.to_string())
    }
}

impl From<CommError> for Failure {
    fn from(e: CommError) -> Self {
        Failure::Comm(e.to_string())
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Torch(t) => t.into(),
            EngineError::Comm(c) => c.into(),
            EngineError::Shim(s) => Failure::from_torch_message(&s.0),
            EngineError::Offload(msg) => Failure::from_torch_message(&msg),
            EngineError::Clock(c) => c.into(),
            EngineError::Cuda(c) => Failure::Internal(format!("CUDA: {c}")),
            EngineError::Pin(PinError::Torch(t)) => t.into(),
            EngineError::Pin(PinError::Alloc(s)) => Failure::from_torch_message(&s.0),
            EngineError::Pin(e @ (PinError::Register { .. } | PinError::Context(_) | PinError::FaultIn { .. })) => {
                match e.out_of_memory_bytes() {
                    Some(bytes) => Failure::Oom { message: e.to_string(), requested_bytes: Some(bytes as u64) },
                    None => Failure::Internal(e.to_string()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal is a config failure (exit 2) and says what to change.
    #[test]
    fn refusals_exit_2_and_say_why() {
        let cases: [(Refused, &str); 5] = [
            (ConfigError::new("warmup", "leaves no step").into(), "invalid --warmup: leaves no step"),
            (Refused::Threads { threads: 99, most: 8 }, "--threads 99 is more than 4 per core of this host (8)"),
            (
                Refused::LocalRank { hint: None, local_rank: 1, local_size: 2 },
                "the launcher gave no local rank (LOCAL_RANK), but this is rank 1 of the 2 ranks on its host",
            ),
            (
                Refused::LocalRank { hint: Some(0), local_rank: 1, local_size: 2 },
                "the launcher gave local rank 0 (LOCAL_RANK), but this is rank 1",
            ),
            (Refused::LaunchCpuWithoutGpu(3), "--launch-cpu 3 places the threads that launch a GPU's work"),
        ];
        for (refused, says) in cases {
            let f = Failure::from(refused);
            assert_eq!((f.exit_code(), f.class()), (2, ErrorClass::Config));
            assert!(f.to_string().starts_with(says), "{f}");
        }
    }

    #[test]
    fn oom_messages_are_recognised_with_their_size() {
        let cuda = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB";
        match Failure::from_torch_message(cuda) {
            Failure::Oom { requested_bytes, .. } => assert_eq!(requested_bytes, Some(2 << 30)),
            f => panic!("{f:?}"),
        }
        let cpu = "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456 bytes. Error code 12";
        match Failure::from_torch_message(cpu) {
            Failure::Oom { requested_bytes, .. } => assert_eq!(requested_bytes, Some(123_456)),
            f => panic!("{f:?}"),
        }
        assert!(matches!(Failure::from_torch_message("shape mismatch"), Failure::Internal(_)));
        let bad_alloc = "called `Result::unwrap()` on an `Err` value: Torch(\"std::bad_alloc\")";
        assert!(matches!(Failure::from_torch_message(bad_alloc), Failure::Oom { .. }));
        assert_eq!(Failure::Oom { message: String::new(), requested_bytes: None }.exit_code(), 3);
    }
}
