//! The worker's JSON-lines log: one file `rank<N>.jsonl` per rank, one record per line, each
//! written and flushed as it happens.
//!
//! Every line is a JSON object whose first key is `event` (the record kind) and whose second is
//! `v`, the schema version. Units are in the field names (`_ms`, `_bytes`, `_w`, `_j`); times are
//! Unix seconds in `ts`. A rank writes `start`, then `setup` once the model and engine exist, one
//! `step` per optimizer step, and finally `end` — or an `error` (and then `end` with a failed
//! status where it still can).
//!
//! Versioning: fields may be added within a version (readers ignore fields they do not know, and
//! an added field is optional, so logs written before it stay valid);
//! renaming, removing or changing the meaning of a field bumps [`SCHEMA_VERSION`]. `docs/log-schema.md`
//! describes every field; `docs/log-schema.json` is the JSON Schema generated from these types
//! (`zerobench schema`).
//!
//! Version 2 changed what a step's time means: `step_ms` ends when all of the step's work has
//! completed on every stream and thread (version 1 stopped the clock when the host last waited
//! for the device, before the optimizer's kernels ran), the phases are disjoint and add up to it,
//! and `overhead_ms` is the loop's own bookkeeping between steps. Readers still take version 1
//! ([`OLDEST_READ_VERSION`]); its step times on GPUs leave out the optimizer's device work.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::memory::ModelStateBytes;
use crate::text_enum::text_enum;

/// The version every record carries in `v`.
pub const SCHEMA_VERSION: u32 = 2;

/// The oldest version readers take: version 1 records parse into these types (the fields added
/// since default to zero), with version 1's meaning of `step_ms`.
pub const OLDEST_READ_VERSION: u32 = 1;

/// Whether readers take records of version `v`.
pub fn version_supported(v: u64) -> bool {
    (u64::from(OLDEST_READ_VERSION)..=u64::from(SCHEMA_VERSION)).contains(&v)
}

/// The rank in a rank log's file name: `rank<N>.jsonl`, also `rank-0003.jsonl`, `rank_3.jsonl`;
/// `None` for any other name.
pub fn rank_from_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("rank")?.strip_suffix(".jsonl")?;
    let digits = digits.strip_prefix(['-', '_']).unwrap_or(digits);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One line of a rank log.
// `Start` is much larger than the other records; there is one per run, so boxing it would buy
// nothing but noise at every construction and match.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    Start(Start),
    Setup(Setup),
    Step(Step),
    Profile(Profile),
    Eval(Eval),
    End(End),
    Error(ErrorRecord),
}

impl Record {
    /// The value of the `event` key.
    pub fn event(&self) -> &'static str {
        match self {
            Record::Start(_) => "start",
            Record::Setup(_) => "setup",
            Record::Step(_) => "step",
            Record::Profile(_) => "profile",
            Record::Eval(_) => "eval",
            Record::End(_) => "end",
            Record::Error(_) => "error",
        }
    }

    /// The schema version the record claims.
    pub fn version(&self) -> u32 {
        match self {
            Record::Start(r) => r.v,
            Record::Setup(r) => r.v,
            Record::Step(r) => r.v,
            Record::Profile(r) => r.v,
            Record::Eval(r) => r.v,
            Record::End(r) => r.v,
            Record::Error(r) => r.v,
        }
    }

    /// The rank that wrote it.
    pub fn rank(&self) -> u32 {
        match self {
            Record::Start(r) => r.rank,
            Record::Setup(r) => r.rank,
            Record::Step(r) => r.rank,
            Record::Profile(r) => r.rank,
            Record::Eval(r) => r.rank,
            Record::End(r) => r.rank,
            Record::Error(r) => r.rank,
        }
    }
}

/// Written first, as soon as the rank knows who it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Start {
    pub v: u32,
    pub ts: f64,
    pub run_id: String,
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    /// Ranks on this node.
    pub local_size: u32,
    /// Index of this node among the run's nodes, and how many nodes there are.
    pub node_rank: u32,
    pub nodes: u32,
    /// Where rank, world size and local rank came from: `mpi`, `env` (ranks that met at a TCP store
    /// through RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT), `env:RANK` or `single` (one process).
    pub rank_source: String,
    pub host: String,
    /// What the host is: its CPU model, CPUs and memory. Offload's host work and the launching of
    /// small steps run at the host's speed, so two hosts of one GPU kind differ there. Absent from
    /// logs of versions before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    pub pid: u32,
    pub config: RunConfig,
    pub model: ModelInfo,
    pub device: DeviceInfo,
    /// `mpi` (CPU tensors over MPI), `gloo` (CPU tensors over c10d's Gloo, for ranks that met at a
    /// TCP store; logs of earlier builds say `tcp`), `nccl` (GPU tensors) or `none` (one rank).
    pub comm_backend: String,
    pub versions: Versions,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmInfo>,
}

/// The host a rank runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Machine {
    /// `model name` of /proc/cpuinfo (the architecture where there is none).
    pub cpu_model: String,
    /// CPUs online on the host (not only those this rank may run on).
    pub cpus: u32,
    /// `MemTotal` of /proc/meminfo; absent where it cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelInfo {
    pub family: String,
    pub params: u64,
    pub units: u32,
    pub largest_unit_params: u64,
    /// Training FLOPs per token of the run (`RunConfig::train_flops_per_token`: at its sequence
    /// length and, for T5, per input token with its target length), for TFLOP/s and MFU. (Added
    /// within version 1, so absent from its earliest logs.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_flops_per_token: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceInfo {
    /// `cpu` or `cuda`.
    pub kind: String,
    /// Device name (GPU model, or the CPU model).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_visible_devices: Option<String>,
    /// Intra-op threads libtorch uses on this rank.
    pub threads: u32,
    /// The CPU this rank's launching threads (the main thread and libtorch's autograd thread)
    /// share from the first backward pass on (`--launch-cpu`); absent where they run free (CPU
    /// runs, `--launch-cpu none`, logs of versions before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_cpu: Option<u32>,
}

/// A build's short name, as the tables, cost models and `predict` name builds: its commit's first
/// 7 characters (by characters: a log's commit is whatever text it holds).
pub fn short_commit(commit: &str) -> String {
    commit.chars().take(7).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Versions {
    pub zerobench: String,
    /// The git commit the worker was built from (`zerobench-build-info`); absent from logs of
    /// earlier builds and of builds made outside a git checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    pub libtorch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_driver: Option<String>,
}

/// The Slurm context of a rank, when it runs inside a job.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct SlurmInfo {
    pub job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodelist: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_task_id: Option<String>,
}

/// Written once the model and the ZeRO engine are set up, before the first forward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Setup {
    pub v: u32,
    pub ts: f64,
    pub rank: u32,
    /// Model states this rank holds, measured from the engine's own buffers.
    pub model_state: ModelStateBytes,
    /// What the ZeRO formulas give for `padded_params` (see `memory.rs`).
    pub model_state_expected: ModelStateBytes,
    /// Ψ after padding every unit to a multiple of world size × alignment.
    pub padded_params: u64,
    /// Persistent engine buffers beyond model states (gradient buckets, gather slots), by name.
    pub buffers_bytes: BTreeMap<String, u64>,
    /// Host memory held for offloaded states (0 without offload), from the buffers themselves.
    pub host_state_bytes: u64,
    /// What `memory::model_state_split` gives for the host. (Added within version 1.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_state_expected_bytes: Option<u64>,
    /// The AdamW implementation: `rust-cpu-avx2` or `rust-cpu` (on the host, which is also where
    /// every offload run updates), `cuda-fused` or `torch-ops`; `HOST+DEVICE` (e.g.
    /// `rust-cpu-avx2+cuda-fused`) when an offload ratio below 1 updates on both. (Added within version 1, so absent
    /// from its earliest logs.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    /// Offload: milliseconds of `setup_ms` spent allocating the host states and, on a GPU,
    /// faulting them in and page-locking what the device copies. (Added within version 1; absent
    /// without offload and from earlier logs.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_state_setup_ms: Option<f64>,
    pub memory: MemorySample,
    pub setup_ms: f64,
}

/// A field that is always written and may be `null` (a loss that is not a finite number: JSON
/// has none): required, unlike serde's default for an `Option`, which takes a missing field as
/// `None`.
fn nullable<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<f64>::deserialize(d)
}

/// A loss as the records hold it: `None` where it is not a finite number.
pub fn finite_loss(loss: f64) -> Option<f64> {
    Some(loss).filter(|l| l.is_finite())
}

/// The JSON Schema of a [`nullable`] field: its type, or `null`.
fn or_null(schema: &mut schemars::Schema) {
    if let Some(t) = schema.get_mut("type") {
        if let serde_json::Value::String(name) = t {
            *t = serde_json::json!([name.clone(), "null"]);
        }
    }
}

/// One optimizer step on one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Step {
    pub v: u32,
    pub ts: f64,
    pub rank: u32,
    /// 0-based optimizer step.
    pub step: u32,
    /// Among the first `config.warmup` steps, which summaries leave out.
    pub warmup: bool,
    /// Mean loss over the global batch of this step (all ranks, all micro-steps); `null` where it
    /// is not a finite number (an fp16 overflow the loss scale skips, a diverged run): the field
    /// is always written.
    #[serde(deserialize_with = "nullable")]
    #[schemars(required, transform = or_null)]
    pub loss: Option<f64>,
    /// fp16: the step was skipped because a gradient overflowed.
    pub skipped: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// Tokens and sequences in the global batch of this step.
    pub tokens: u64,
    pub samples: u64,
    /// Wall time of the whole step on this rank: from the start of its work to the completion of
    /// all of its device work, on every stream (compute, communication, copies); the device is
    /// synchronised at the step's end, as a user's training loop is. With offload the host's
    /// updates of the step's last units may still run then: the next step's forward waits for
    /// each at its unit, so their time is in the next step's (consecutive steps never overlap,
    /// and the interval between step records stays `step_ms + overhead_ms`).
    pub step_ms: f64,
    /// Forward computation, without the time it waited for communication. The five phases
    /// `forward_ms`, `backward_ms`, `exposed_comm_ms`, `optimizer_ms` and `other_ms` are disjoint
    /// and add up to `step_ms`.
    pub forward_ms: f64,
    /// Backward computation (its reductions issued), without the time it waited for communication.
    pub backward_ms: f64,
    /// The optimizer step, its device work and the step's final synchronisation included, plus
    /// the time computation waited for offload's host updates in the other phases.
    pub optimizer_ms: f64,
    /// Sum of the durations of this step's collectives (they overlap computation, so this is not
    /// a phase).
    pub comm_ms: f64,
    /// Time computation waited for communication (on CPU, where collectives block, all of it).
    pub exposed_comm_ms: f64,
    /// The rest of the step: `step_ms` minus the four phases above (input batches, launch gaps,
    /// host work the device waited for). (Added in version 2.)
    #[serde(default)]
    pub other_ms: f64,
    /// The training loop's own cost between the previous step's end and this step's start (reading
    /// the previous step's timers and memory, handing its record to the log writer). The interval
    /// between two step records is `step_ms + overhead_ms` of the later one. 0 for the first
    /// step. (Added in version 2.)
    #[serde(default)]
    pub overhead_ms: f64,
    /// Per collective kind (`all_reduce`, `reduce_scatter`, `all_gather`, `broadcast`).
    pub comm: BTreeMap<String, CommStats>,
    pub memory: MemorySample,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
    /// Energy the GPU used since the run started (NVML's counter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    /// NVML GPU utilisation (percent of time a kernel ran) sampled at the end of the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util_pct: Option<u32>,
}

/// One collective kind within a step. `bytes` is the size of the full array in nccl-tests'
/// convention (all-reduce: the buffer; reduce-scatter: input; all-gather: output), so
/// bus bandwidth = bytes / time × factor(kind, world size).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CommStats {
    pub calls: u64,
    pub bytes: u64,
    pub ms: f64,
    /// The largest single call of the step.
    pub max_bytes: u64,
    /// Bus bandwidth over the step's calls of this kind, in GB/s (1e9 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_gbps: Option<f64>,
}

/// Memory of one rank at one moment; allocator figures are the CUDA caching allocator's (absent on
/// CPU), peaks are since the previous sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemorySample {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_retries: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ooms: Option<u64>,
    /// Device memory used as NVML sees it (context, NCCL and allocator slack included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_used_bytes: Option<u64>,
    /// Resident set size of the process.
    pub rss_bytes: u64,
}

/// `--profile-step N`: where the time of step N went, per kind of module (what DeepSpeed's FLOPs
/// profiler prints per module), written after that step's `step` record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Profile {
    pub v: u32,
    pub ts: f64,
    pub rank: u32,
    pub step: u32,
    pub modules: Vec<ModuleProfile>,
}

/// `--eval-every N`: the loss on held-out samples after step `step` (every N steps and after the
/// last), written after that step's `step` record. Its time is not part of any step's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Eval {
    pub v: u32,
    pub ts: f64,
    pub rank: u32,
    /// The 0-based optimizer step after which the model was evaluated.
    pub step: u32,
    /// Mean loss over the held-out samples of all ranks (forward only, no update); `null` where
    /// it is not a finite number.
    #[serde(deserialize_with = "nullable")]
    #[schemars(required, transform = or_null)]
    pub loss: Option<f64>,
    /// Held-out sequences (samples for the MLP) over all ranks: one global batch.
    pub samples: u64,
    /// Wall time of the evaluation on this rank, from its first forward to the mean over ranks.
    pub eval_ms: f64,
}

/// One kind of module (e.g. every transformer block) over one step on one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModuleProfile {
    /// `embed`, `block`, `head`, ...
    pub kind: String,
    /// Modules of this kind.
    pub count: u32,
    /// Parameters the modules read (the tied LM head reads the embedding's).
    pub params: u64,
    /// Forward FLOPs over the step (micro-steps included); backward is about twice.
    pub forward_flops: f64,
    pub forward_ms: f64,
    pub backward_ms: f64,
    /// Achieved TFLOP/s in forward and in backward (taken as 2× forward FLOPs).
    pub forward_tflops: f64,
    pub backward_tflops: f64,
}

/// How a rank's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    /// Out of device (or host) memory.
    Oom,
    Failed,
}
text_enum!(RunStatus, "run status", { Ok => "ok", Oom => "oom", Failed => "failed" });

/// Written last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct End {
    pub v: u32,
    pub ts: f64,
    pub rank: u32,
    pub status: RunStatus,
    pub steps_completed: u32,
    /// The process exit code that follows.
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
}

/// Over the measured (non-warmup) steps of the run, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Summary {
    pub steps: u32,
    /// The run's step time: per step the slowest rank's `step_ms`, then the median over measured
    /// steps (ingest's rule too). Version 1 took this rank's own steps.
    pub step_ms_median: f64,
    /// Global tokens per second (all ranks).
    pub tokens_per_s: f64,
    /// The last step's loss; `null` where it is not a finite number.
    #[serde(deserialize_with = "nullable")]
    #[schemars(required, transform = or_null)]
    pub final_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
}

impl Summary {
    /// The final loss as the worker and `zerobench status` print it: four decimals, or
    /// `not finite`.
    pub fn final_loss_text(&self) -> String {
        self.final_loss.map_or_else(|| "not finite".to_string(), |l| format!("{l:.4}"))
    }
}

/// What kind of failure an `error` record reports.
// Ordered as declared, so that errors sort the same way wherever they are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    Oom,
    /// A collective failed or stalled (a peer rank died or hung).
    Comm,
    Config,
    Io,
    Internal,
    /// Stopped by a signal: cancelled, out of time, or stopped by the launcher after another rank
    /// failed.
    Terminated,
}
text_enum!(ErrorClass, "error class", {
    Oom => "oom",
    Comm => "comm",
    Config => "config",
    Io => "io",
    Internal => "internal",
    Terminated => "terminated",
});

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorRecord {
    pub v: u32,
    pub ts: f64,
    pub rank: u32,
    pub class: ErrorClass,
    pub message: String,
    /// The step it happened in, if training had begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// OOM: the allocation that failed, in bytes, when the allocator said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// OOM: memory at that moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySample>,
}

/// Why a line is not a valid record.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(
        "schema version {found} is not supported (this build reads versions {OLDEST_READ_VERSION} to {SCHEMA_VERSION})"
    )]
    Version { found: u32 },
    #[error("field {path} is not part of schema version {SCHEMA_VERSION}")]
    UnknownField { path: String },
}

/// Parses one line leniently: unknown fields are ignored (they may come from a newer writer of the
/// same version), an unknown version is an error.
pub fn parse_line(line: &[u8]) -> Result<Record, LineError> {
    let rec: Record = serde_json::from_slice(line)?;
    if !version_supported(u64::from(rec.version())) {
        return Err(LineError::Version { found: rec.version() });
    }
    Ok(rec)
}

/// Why a line that [`parse_line`] refused is not a record of its `event`, naming the field and
/// the column: serde's message for the tagged [`Record`] has neither (the line is buffered before
/// the variant is known), so the line is parsed again as the record type its `event` names.
/// `None` when the line names no known event, or parses as that record after all.
pub fn explain(line: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Tag {
        event: String,
    }
    fn why<T: serde::de::DeserializeOwned>(line: &[u8]) -> Option<String> {
        let mut de = serde_json::Deserializer::from_slice(line);
        let err = serde_path_to_error::deserialize::<_, T>(&mut de).err()?;
        // serde_json ends its message with "at line 1 column N": the line is the file's, named by
        // the caller, so only the column is kept.
        let mut msg = err.inner().to_string();
        if let Some(at) = msg.rfind(" at line ") {
            msg.truncate(at);
        }
        let msg = format!("{msg} (column {})", err.inner().column());
        // A missing field is reported at the record itself (path "."); its message names it.
        Some(match err.path().to_string().as_str() {
            "." => msg,
            path => format!("field {path}: {msg}"),
        })
    }
    match serde_json::from_slice::<Tag>(line).ok()?.event.as_str() {
        "start" => why::<Start>(line),
        "setup" => why::<Setup>(line),
        "step" => why::<Step>(line),
        "profile" => why::<Profile>(line),
        "eval" => why::<Eval>(line),
        "end" => why::<End>(line),
        "error" => why::<ErrorRecord>(line),
        _ => None,
    }
}

/// Parses one line strictly: like [`parse_line`] (any version readers take), and every field of
/// the line must be one this schema defines. This is how tests check that the worker writes exactly the documented schema.
pub fn validate_line(line: &[u8]) -> Result<Record, LineError> {
    let raw: serde_json::Value = serde_json::from_slice(line)?;
    if let Some(v) = raw.get("v").and_then(serde_json::Value::as_u64) {
        if !version_supported(v) {
            return Err(LineError::Version { found: u32::try_from(v).unwrap_or(u32::MAX) });
        }
    }
    let rec = parse_line(line)?;
    let back = serde_json::to_value(&rec)?;
    if let Some(path) = first_unknown(&raw, &back, String::new()) {
        return Err(LineError::UnknownField { path });
    }
    Ok(rec)
}

/// The first key present in `raw` but absent from the re-serialised `known`.
fn first_unknown(raw: &serde_json::Value, known: &serde_json::Value, at: String) -> Option<String> {
    match (raw, known) {
        (serde_json::Value::Object(r), serde_json::Value::Object(k)) => r.iter().find_map(|(key, rv)| {
            let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
            match k.get(key) {
                None if rv.is_null() => None,
                None => Some(path),
                Some(kv) => first_unknown(rv, kv, path),
            }
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refused_record_is_explained_by_its_field_and_column() {
        let step = r#"{"event":"step","v":1,"ts":1.0,"rank":0,"step":3,"warmup":false,"loss":2.5,"skipped":false,"tokens":8,"samples":2,"step_ms":"fast"}"#;
        assert!(super::parse_line(step.as_bytes()).is_err());
        let why = super::explain(step.as_bytes()).expect("a step record");
        assert_eq!(why, "field step_ms: invalid type: string \"fast\", expected f64 (column 130)");
        assert_eq!(super::explain(br#"{"event":"lunch","v":1}"#), None);
        assert_eq!(super::explain(b"not json"), None);
    }

    use super::*;
    use crate::config::{RunConfig, ZeroStage};
    use crate::models::ModelPreset;

    fn step() -> Step {
        Step {
            v: SCHEMA_VERSION,
            ts: 1.5,
            rank: 1,
            step: 3,
            warmup: false,
            loss: Some(2.5),
            skipped: false,
            loss_scale: None,
            tokens: 4096,
            samples: 4,
            step_ms: 10.0,
            forward_ms: 3.0,
            backward_ms: 5.0,
            optimizer_ms: 1.0,
            comm_ms: 2.0,
            exposed_comm_ms: 2.0,
            other_ms: 0.0,
            overhead_ms: 0.1,
            comm: BTreeMap::from([(
                "all_reduce".to_string(),
                CommStats { calls: 2, bytes: 100, ms: 2.0, max_bytes: 60, bus_gbps: Some(0.1) },
            )]),
            memory: MemorySample { rss_bytes: 1 << 20, ..Default::default() },
            power_w: None,
            energy_j: None,
            gpu_util_pct: None,
        }
    }

    #[test]
    fn rank_names() {
        assert_eq!(rank_from_name("rank0.jsonl"), Some(0));
        assert_eq!(rank_from_name("rank-0012.jsonl"), Some(12));
        assert_eq!(rank_from_name("rank_7.jsonl"), Some(7));
        for bad in
            ["rank.jsonl", "rankx.jsonl", "rank1.json", "xrank1.jsonl", "rank1.jsonl.gz", "rank99999999999.jsonl"]
        {
            assert_eq!(rank_from_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn text_forms_are_the_json_names() {
        for s in RunStatus::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str(), "{s:?}");
        }
    }

    #[test]
    fn event_key_comes_first_then_version() {
        let line = serde_json::to_string(&Record::Step(step())).unwrap();
        assert!(line.starts_with(&format!(r#"{{"event":"step","v":{SCHEMA_VERSION},"#)), "{line}");
        let back = validate_line(line.as_bytes()).unwrap();
        assert_eq!(back, Record::Step(step()));
    }

    #[test]
    fn unknown_fields_pass_lenient_and_fail_strict() {
        let line = serde_json::to_string(&Record::Step(step())).unwrap();
        let extra = line.replacen(r#""loss":2.5"#, r#""loss":2.5,"lozz":1"#, 1);
        parse_line(extra.as_bytes()).unwrap();
        let err = validate_line(extra.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("lozz"), "{err}");
        let nested = line.replacen(r#""calls":2"#, r#""calls":2,"x":0"#, 1);
        assert!(validate_line(nested.as_bytes()).unwrap_err().to_string().contains("comm.all_reduce.x"));
    }

    #[test]
    fn versions_outside_the_supported_range_are_refused() {
        let current = serde_json::to_string(&Record::Step(step())).unwrap();
        let with = |v: u32| current.replacen(&format!(r#""v":{SCHEMA_VERSION}"#), &format!(r#""v":{v}"#), 1);
        for v in [0, SCHEMA_VERSION + 1] {
            assert!(matches!(parse_line(with(v).as_bytes()), Err(LineError::Version { found }) if found == v));
            assert!(matches!(validate_line(with(v).as_bytes()), Err(LineError::Version { found }) if found == v));
        }
    }

    #[test]
    fn version_1_steps_still_read_with_the_fields_added_since_at_zero() {
        let v1 = serde_json::to_string(&Record::Step(step()))
            .unwrap()
            .replacen(&format!(r#""v":{SCHEMA_VERSION}"#), r#""v":1"#, 1)
            .replacen(r#","other_ms":0.0,"overhead_ms":0.1"#, "", 1);
        assert!(!v1.contains("overhead_ms"), "{v1}");
        let Record::Step(s) = validate_line(v1.as_bytes()).unwrap() else { panic!("a step") };
        assert_eq!((s.v, s.other_ms, s.overhead_ms), (1, 0.0, 0.0));
    }

    #[test]
    fn error_classes_have_one_text_form_and_sort_as_declared() {
        for (i, c) in ErrorClass::ALL.iter().enumerate() {
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::Value::String(c.as_str().into()));
            assert!(ErrorClass::ALL[..i].iter().all(|earlier| earlier < c));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [&b""[..], b"{", b"\xff\xfe", b"[]", br#"{"event":"nope","v":1}"#, br#"{"event":"end"}"#] {
            assert!(parse_line(bad).is_err());
        }
    }

    fn start() -> Start {
        Start {
            v: SCHEMA_VERSION,
            ts: 0.0,
            run_id: "r".into(),
            rank: 0,
            world_size: 2,
            local_rank: 0,
            local_size: 2,
            node_rank: 0,
            nodes: 1,
            rank_source: "mpi".into(),
            host: "h".into(),
            machine: None,
            pid: 1,
            config: RunConfig::new(ModelPreset::Tiny, ZeroStage::Z2),
            model: ModelInfo {
                family: "gpt2".into(),
                params: 1,
                units: 1,
                largest_unit_params: 1,
                train_flops_per_token: Some(6.0),
            },
            device: DeviceInfo {
                kind: "cpu".into(),
                name: "x".into(),
                index: None,
                total_memory_bytes: None,
                cuda_visible_devices: None,
                threads: 1,
                launch_cpu: None,
            },
            comm_backend: "mpi".into(),
            versions: Versions::default(),
            slurm: None,
        }
    }

    #[test]
    fn start_carries_the_config() {
        let start = start();
        let line = serde_json::to_string(&Record::Start(start.clone())).unwrap();
        assert_eq!(validate_line(line.as_bytes()).unwrap(), Record::Start(start));
    }
    /// A plus sign is not a digit: `rank+5.jsonl` is not rank 5's log (Rust's integer parsing
    /// would take the `+`).
    #[test]
    fn a_signed_number_is_not_a_rank() {
        for bad in ["rank+5.jsonl", "rank_+5.jsonl", "rank-+5.jsonl"] {
            assert_eq!(rank_from_name(bad), None, "{bad}");
        }
    }

    /// Records of every kind, with distinct ranks 0-6 in declaration order.
    fn one_of_each() -> Vec<Record> {
        let setup = Setup {
            v: SCHEMA_VERSION,
            ts: 1.0,
            rank: 1,
            model_state: ModelStateBytes::default(),
            model_state_expected: ModelStateBytes::default(),
            padded_params: 0,
            buffers_bytes: BTreeMap::new(),
            host_state_bytes: 0,
            host_state_expected_bytes: None,
            optimizer: None,
            host_state_setup_ms: None,
            memory: MemorySample::default(),
            setup_ms: 1.0,
        };
        let profile = Profile { v: SCHEMA_VERSION, ts: 2.0, rank: 3, step: 3, modules: vec![] };
        let eval = Eval { v: SCHEMA_VERSION, ts: 3.0, rank: 4, step: 3, loss: Some(2.4), samples: 4, eval_ms: 5.0 };
        let end = End {
            v: SCHEMA_VERSION,
            ts: 4.0,
            rank: 5,
            status: RunStatus::Ok,
            steps_completed: 4,
            exit_code: 0,
            summary: None,
        };
        let error = ErrorRecord {
            v: SCHEMA_VERSION,
            ts: 5.0,
            rank: 6,
            class: ErrorClass::Oom,
            message: "out of memory".into(),
            step: Some(3),
            requested_bytes: None,
            memory: None,
        };
        vec![
            Record::Start(start()),
            Record::Setup(setup),
            Record::Step(Step { rank: 2, ..step() }),
            Record::Profile(profile),
            Record::Eval(eval),
            Record::End(end),
            Record::Error(error),
        ]
    }

    /// `event()` is the `event` key each record is written with, and `rank()` the rank it carries.
    #[test]
    fn every_record_names_its_event_and_rank() {
        let events = ["start", "setup", "step", "profile", "eval", "end", "error"];
        for (i, (rec, event)) in one_of_each().iter().zip(events).enumerate() {
            assert_eq!(rec.event(), event);
            assert_eq!(serde_json::to_value(rec).unwrap()["event"], event);
            assert_eq!(rec.rank(), i as u32, "{event}");
        }
    }

    /// A malformed field is explained by its name in the records `explain` knows.
    #[test]
    fn explain_names_the_bad_field_of_each_record_kind() {
        for event in ["start", "setup", "step", "profile", "eval", "end", "error"] {
            let line = format!(r#"{{"event":"{event}","v":{SCHEMA_VERSION},"ts":"noon"}}"#);
            assert!(parse_line(line.as_bytes()).is_err(), "{event}");
            let why = explain(line.as_bytes()).unwrap_or_else(|| panic!("{event}: not explained"));
            assert!(
                why.starts_with(r#"field ts: invalid type: string "noon", expected f64 (column "#),
                "{event}: {why}"
            );
        }
    }

    /// A writer may spell an absent optional field as `null`: the strict check takes it.
    #[test]
    fn a_null_optional_field_passes_the_strict_check() {
        let line = serde_json::to_string(&Record::Step(step())).unwrap();
        assert!(!line.contains("power_w"), "{line}");
        let with_null = line.replacen(r#""loss":2.5"#, r#""loss":2.5,"power_w":null"#, 1);
        assert_eq!(validate_line(with_null.as_bytes()).unwrap(), Record::Step(step()));
    }
}

#[cfg(test)]
mod schema_doc_tests {
    /// `docs/log-schema.json` is what `zerobench schema` prints; regenerate it with
    /// `cargo run -p zerobench -- schema > docs/log-schema.json` when the records change.
    #[test]
    fn committed_json_schema_is_current() {
        let generated = serde_json::to_string_pretty(&schemars::schema_for!(super::Record)).unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/log-schema.json");
        let committed = std::fs::read_to_string(path).unwrap();
        assert_eq!(
            committed.trim_end(),
            generated,
            "docs/log-schema.json is stale: run `cargo run -p zerobench -- schema > docs/log-schema.json`"
        );
    }
}
