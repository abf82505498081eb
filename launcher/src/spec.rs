//! The experiment spec: a YAML file with a `cluster`, a `launch` method, fixed `worker` settings
//! and a `sweep` matrix. `docs/launcher.md` documents every key.
//!
//! Loading checks everything that can be checked without running: unknown keys, wrong types and
//! impossible values are errors naming the file, line, column and key. Values check themselves
//! while serde_yaml parses ([`crate::values`]), so serde_yaml places those errors; rules across
//! keys are checked afterwards and placed with [`KeyIndex`].

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use zerobench_schema::config::{EngineConfig, OptimConfig};
use zerobench_schema::fields::field_names;
use zerobench_schema::{ModelPreset, Offload, Precision, RunConfig, ZeroStage};

use crate::hostfile::{Hostfile, HostfileFormat};
use crate::hostlist;
use crate::locate::{KeyIndex, Pos};
use crate::select::{Filter, Resources};
use crate::values::{builtin, ByteSize, EnvName, SlurmName, Text, TimeLimit};

/// A spec that cannot be used, with where and which key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {key}{sep}{message}", file.display(), crate::hostfile::at(*line, *column), sep = if key.is_empty() { "" } else { ": " })]
pub struct SpecError {
    pub file: PathBuf,
    /// 1-based; 0 when the problem is the whole file (it cannot be read).
    pub line: usize,
    pub column: usize,
    /// The key path, e.g. `sweep[1].offload`; empty when serde_yaml's message already names it.
    pub key: String,
    pub message: String,
}

/// How the ranks of a run are started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// `srun --mpi=pmix` inside the sbatch job: Slurm starts every rank.
    #[default]
    Srun,
    /// `mpirun` inside the sbatch job (or over the hostfile).
    Mpirun,
    /// DeepSpeed's way: `pdsh -S -R ssh` starts one launcher per host, which starts its ranks.
    Pdsh,
    /// torchrun's convention under Slurm: `srun` starts every rank with `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` from the step; no MPI.
    Torchrun,
    /// `mpirun --oversubscribe --bind-to none` on this host, no Slurm (`zerobench local`).
    Local,
}

impl Method {
    /// Whether the ranks meet through the environment convention (`MASTER_ADDR:MASTER_PORT`)
    /// rather than MPI.
    pub fn rendezvous_by_env(self) -> bool {
        matches!(self, Method::Pdsh | Method::Torchrun)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Srun => "srun",
            Method::Mpirun => "mpirun",
            Method::Pdsh => "pdsh",
            Method::Torchrun => "torchrun",
            Method::Local => "local",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which MPI's `mpirun` the `mpirun` method drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MpiImpl {
    #[default]
    Openmpi,
    Mpich,
}

/// pdsh's remote command module. `ssh` is DeepSpeed's; `exec` runs the per-host command on this
/// host, which is how a single machine stands in for several.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PdshRcmd {
    #[default]
    Ssh,
    Exec,
}

/// Where the runs go and what they may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cluster {
    pub partition: Option<SlurmName>,
    pub account: Option<SlurmName>,
    pub qos: Option<SlurmName>,
    /// Time limit of each run's job (and of each run under `zerobench local`).
    pub time: Option<TimeLimit>,
    /// GPUs per node; 0 for CPU-only nodes.
    pub gpus_per_node: u32,
    pub cpus_per_task: u32,
    pub cpus_per_node: Option<u32>,
    /// Memory of one GPU; runs whose model states do not fit are flagged.
    pub gpu_memory: Option<ByteSize>,
    /// Host memory each job asks for per node (`#SBATCH --mem`); runs whose offloaded states need
    /// more are flagged.
    pub mem: Option<ByteSize>,
    /// Host memory per CPU (`#SBATCH --mem-per-cpu`), the other way Slurm sizes a job's memory:
    /// a node then gets it times its ranks' CPUs (`cpus_per_task` each). Not with `mem`.
    pub mem_per_cpu: Option<ByteSize>,
    /// `module load` lines, in order.
    pub modules: Vec<Text>,
    /// Exported before the ranks start and forwarded to them.
    pub env: BTreeMap<EnvName, String>,
    /// Hosts to run on instead of what Slurm allocates (pdsh needs one; mpirun may use one).
    pub hostfile: Option<PathBuf>,
    pub hostfile_format: HostfileFormat,
    /// DeepSpeed-style filters on the hostfile (`worker-0:0,2@worker-1`).
    pub include: Option<String>,
    pub exclude: Option<String>,
    /// Restrict Slurm to these nodes (`#SBATCH --nodelist`), as a hostlist expression.
    pub nodelist: Option<String>,
    /// Run as job steps of an existing allocation (from `salloc` or a held job) instead of
    /// submitting a job per run; `zerobench local` runs the scripts.
    pub allocation: Option<Allocation>,
}

/// An existing Slurm allocation to run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Allocation {
    /// A job id: `srun --jobid=N` from anywhere the Slurm commands work.
    Job(u64),
    /// The allocation of the shell the scripts run in (`$SLURM_JOB_ID`, as inside `salloc`).
    #[serde(serialize_with = "current")]
    Current,
}

fn current<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("current")
}

impl<'de> Deserialize<'de> for Allocation {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Allocation::Job(n)),
            Raw::S(s) if s == "current" => Ok(Allocation::Current),
            Raw::S(s) => s
                .parse()
                .map(Allocation::Job)
                .map_err(|_| de::Error::custom(format!("'{}' is not a job id or 'current'", s.escape_debug()))),
        }
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            partition: None,
            account: None,
            qos: None,
            time: None,
            gpus_per_node: 0,
            cpus_per_task: 1,
            cpus_per_node: None,
            gpu_memory: None,
            mem: None,
            mem_per_cpu: None,
            modules: Vec::new(),
            env: BTreeMap::new(),
            hostfile: None,
            hostfile_format: HostfileFormat::default(),
            include: None,
            exclude: None,
            nodelist: None,
            allocation: None,
        }
    }
}

/// How ranks are started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Launch {
    pub method: Method,
    /// `srun --mpi=` value.
    pub mpi: SlurmName,
    /// Which `mpirun` the `mpirun` method writes for.
    pub mpi_impl: MpiImpl,
    pub pdsh_rcmd: PdshRcmd,
    /// Rendezvous port of the pdsh and torchrun methods (`MASTER_PORT`); derived from the run id
    /// (and the Slurm job id, for torchrun) when absent.
    pub master_port: Option<u16>,
    /// pdsh over ssh: the hosts' ssh port (DeepSpeed's `--ssh_port`), passed to ssh through
    /// `PDSH_SSH_ARGS_APPEND`; absent: ssh's own (22, or the user's ssh configuration).
    pub ssh_port: Option<u16>,
    /// The worker program, a path or a name on `PATH` where the ranks run.
    pub worker: Text,
}

impl Default for Launch {
    fn default() -> Self {
        Launch {
            method: Method::default(),
            mpi: builtin("pmix"),
            mpi_impl: MpiImpl::default(),
            pdsh_rcmd: PdshRcmd::default(),
            master_port: None,
            ssh_port: None,
            worker: builtin("zerobench-worker"),
        }
    }
}

/// Worker settings shared by every run, under `RunConfig`'s own field names: its fields that are
/// not sweep axes, and its optimizer's and engine's knobs by their names (`lr`, `bucket_mb`).
/// The names and their types are `RunConfig`'s, so a knob added there is a spec key at once;
/// absent ones take `RunConfig`'s defaults. `target_len` applies to the encoder-decoder (T5) runs
/// only, and `delayed_update_after` to the offloaded runs only, so one spec can sweep both kinds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    /// `--trace`: each rank writes a Chrome/Perfetto trace of the first measured steps.
    #[serde(default)]
    pub trace: bool,
    /// `--profile-step N`: each rank logs a per-module breakdown of step N.
    #[serde(default)]
    pub profile_step: Option<u32>,
    #[serde(flatten)]
    settings: BTreeMap<String, serde_yaml::Value>,
    /// `data`, the text to train on, anchored to the spec's folder.
    #[serde(skip)]
    pub data: Option<PathBuf>,
}

/// The `RunConfig` fields a sweep block sets, with the axis that sets them: a worker key of
/// this name is refused with a pointer to the axis.
const SWEPT: [(&str, &str); 6] = [
    ("model", "models"),
    ("stage", "stages"),
    ("offload", "offload"),
    ("offload_ratio", "offload_ratio"),
    ("precision", "precision"),
    ("micro_batch", "micro_batches"),
];

/// The sweep axis that sets `RunConfig` field `field`, if a sweep block sets it.
pub fn sweep_axis_of(field: &str) -> Option<&'static str> {
    SWEPT.iter().find(|(name, _)| *name == field).map(|(_, axis)| *axis)
}

/// A worker setting `RunConfig` cannot take: the key, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    pub key: String,
    pub message: String,
}

/// Where a worker key sits in `RunConfig`'s serialized form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Top,
    Nested(&'static str),
}

impl Worker {
    /// Every key a worker block may hold, in `RunConfig`'s declaration order.
    pub fn keys() -> Vec<&'static str> {
        let mut keys = Vec::new();
        for &field in field_names::<RunConfig>() {
            match field {
                "optim" => keys.extend(field_names::<OptimConfig>()),
                "engine" => keys.extend(field_names::<EngineConfig>()),
                f if sweep_axis_of(f).is_some() => {}
                f => keys.push(f),
            }
        }
        keys
    }

    fn slot(key: &str) -> Option<Slot> {
        if field_names::<OptimConfig>().contains(&key) {
            Some(Slot::Nested("optim"))
        } else if field_names::<EngineConfig>().contains(&key) {
            Some(Slot::Nested("engine"))
        } else {
            Self::keys().contains(&key).then_some(Slot::Top)
        }
    }

    /// The worker flags that observe a run without changing what it computes (`--trace`,
    /// `--profile-step`), which are not part of its configuration.
    pub fn observe_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.trace {
            args.push("--trace".to_string());
        }
        if let Some(n) = self.profile_step {
            args.extend(["--profile-step".to_string(), n.to_string()]);
        }
        args
    }

    /// Whether the spec sets `key`.
    pub fn sets(&self, key: &str) -> bool {
        self.settings.contains_key(key)
    }

    /// `config` with these settings over it, but for the keys `skip` names, and then the sweep's
    /// `knobs` (which set keys this block does not); an error names the key whose value
    /// `RunConfig` cannot take.
    pub fn apply(
        &self,
        config: &RunConfig,
        skip: impl Fn(&str) -> bool,
        knobs: &[Knob],
    ) -> Result<RunConfig, SettingError> {
        // Through YAML's value, which keeps a NaN a NaN (JSON's would turn it into null, and a
        // NaN ratio from the sweep into "no ratio" that validation then could not refuse).
        let mut value =
            serde_yaml::to_value(config).map_err(|e| SettingError { key: String::new(), message: e.to_string() })?;
        let knobs = knobs.iter().map(|k| (k.field, &k.value));
        for (key, setting) in self.settings.iter().map(|(k, v)| (k.as_str(), v)).filter(|(k, _)| !skip(k)).chain(knobs)
        {
            let target = match Self::slot(key) {
                Some(Slot::Top) => &mut value[key],
                Some(Slot::Nested(parent)) => &mut value[parent][key],
                None => return Err(SettingError { key: key.to_string(), message: "is not a worker key".into() }),
            };
            *target = setting.clone();
        }
        let mut applied: RunConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().iter().next_back().map_or_else(String::new, |seg| seg.to_string());
            SettingError { key, message: e.into_inner().to_string() }
        })?;
        if !skip("data") {
            if let Some(d) = &self.data {
                applied.data = Some(d.clone());
            }
        }
        Ok(applied)
    }
}

/// One block of the sweep matrix: the runs are the cartesian product of its axes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepBlock {
    pub models: OneOrMany<ModelPreset>,
    #[serde(default)]
    pub stages: Option<OneOrMany<ZeroStage>>,
    #[serde(default)]
    pub offload: Option<OneOrMany<Offload>>,
    /// Twin-Flow: the host's share of each offloaded optimizer partition (`--offload-ratio`), in
    /// (0, 1]. Applies to the offloaded runs of the block; runs without offload ignore it.
    #[serde(default)]
    pub offload_ratio: Option<OneOrMany<f64>>,
    #[serde(default)]
    pub precision: Option<OneOrMany<Precision>>,
    #[serde(default)]
    pub micro_batches: Option<OneOrMany<u32>>,
    #[serde(default)]
    pub nodes: Option<OneOrMany<u32>>,
    /// Ranks per node: one per GPU on GPU nodes (`ranks_per_node` is the same key).
    #[serde(default, alias = "ranks_per_node")]
    pub gpus_per_node: Option<OneOrMany<u32>>,
    /// Micro-steps per optimizer step (`--grad-accum`); a run id then ends in `_ga<n>`.
    #[serde(default)]
    pub grad_accum: Option<OneOrMany<u32>>,
    /// Stage 3: hpZ group sizes (`--hpz`); `_hpz<n>`.
    #[serde(default)]
    pub hpz: Option<OneOrMany<u32>>,
    /// Stage 3: blocks gathered ahead (`--prefetch`); `_pf<n>`.
    #[serde(default)]
    pub prefetch: Option<OneOrMany<u32>>,
    /// Gradient bucket sizes in MiB (`--bucket-mb`); `_bk<n>` (`.` written `p`).
    #[serde(default)]
    pub bucket_mb: Option<OneOrMany<f64>>,
}

/// One value of an engine setting a sweep block varies (and the worker block may fix instead):
/// `RunConfig`'s field name, its value as the worker block would give it, and its run-id part.
#[derive(Debug, Clone, PartialEq)]
pub struct Knob {
    pub field: &'static str,
    value: serde_yaml::Value,
    id_part: String,
}

impl Knob {
    /// `field` at `v`, named `prefix` and the value in a run id (`.` written `p`).
    fn new<T: Serialize + fmt::Display>(field: &'static str, prefix: &str, v: T) -> Knob {
        // A number always serializes; a failure would surface as a type error when applied.
        let value = serde_yaml::to_value(&v).unwrap_or_default();
        Knob { field, value, id_part: format!("{prefix}{}", v.to_string().replace('.', "p")) }
    }

    /// Its part of a run id (see the grammar in `plan`).
    pub fn id_part(&self) -> &str {
        &self.id_part
    }
}

impl SweepBlock {
    /// The engine settings this block varies, one list per axis it gives, in a fixed order.
    pub fn knob_axes(&self) -> Vec<Vec<Knob>> {
        fn axis<T: Serialize + fmt::Display + Copy>(
            v: &Option<OneOrMany<T>>,
            field: &'static str,
            prefix: &str,
        ) -> Option<Vec<Knob>> {
            v.as_ref().map(|v| v.0.iter().map(|&x| Knob::new(field, prefix, x)).collect())
        }
        [
            axis(&self.grad_accum, "grad_accum", "ga"),
            axis(&self.hpz, "hpz", "hpz"),
            axis(&self.prefetch, "prefetch", "pf"),
            axis(&self.bucket_mb, "bucket_mb", "bk"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// A YAML value or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct OneOrMany<T>(pub Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = OneOrMany<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value or a list of values")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::<T>::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(OneOrMany)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|v| OneOrMany(vec![v]))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                T::deserialize(de::value::StrDeserializer::<E>::new(v)).map(|v| OneOrMany(vec![v]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                T::deserialize(de::value::U64Deserializer::<E>::new(v)).map(|v| OneOrMany(vec![v]))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                T::deserialize(de::value::I64Deserializer::<E>::new(v)).map(|v| OneOrMany(vec![v]))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                T::deserialize(de::value::BoolDeserializer::<E>::new(v)).map(|v| OneOrMany(vec![v]))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                T::deserialize(de::value::F64Deserializer::<E>::new(v)).map(|v| OneOrMany(vec![v]))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    #[serde(default)]
    cluster: Cluster,
    #[serde(default)]
    launch: Launch,
    #[serde(default)]
    worker: Worker,
    sweep: OneOrMany<SweepBlock>,
}

/// A loaded, checked spec.
#[derive(Debug)]
pub struct Spec {
    /// The file it came from.
    pub path: PathBuf,
    pub cluster: Cluster,
    pub launch: Launch,
    pub worker: Worker,
    pub sweep: Vec<SweepBlock>,
    /// The hostfile's hosts after `include`/`exclude`, when the cluster names a hostfile.
    pub resources: Option<Resources>,
    /// Whether `sweep:` was written as a list (key paths then read `sweep[i].…`).
    sweep_is_list: bool,
    index: KeyIndex,
}

/// The most runs one spec may expand to; more is almost certainly a typo in an axis.
pub const MAX_RUNS: usize = 100_000;

impl Spec {
    /// Reads, parses and checks a spec file.
    pub fn load(path: &Path) -> Result<Spec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|e| SpecError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks spec text; `path` names it in errors and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Spec, SpecError> {
        flow_depth(text, path)?;
        let index = KeyIndex::build(text);
        if let Some((key, first, again)) = index.duplicate() {
            // serde keeps the last of a flattened map's keys (`worker:`, `cluster.env`) in silence.
            return Err(SpecError {
                file: path.to_path_buf(),
                line: again.line,
                column: again.column,
                key: key.to_string(),
                message: format!("given twice (first at line {}); a key may appear once", first.line),
            });
        }
        let file: SpecFile = serde_yaml::from_str(text).map_err(|e| yaml_error(path, &index, &e))?;
        let mut spec = Spec {
            path: path.to_path_buf(),
            cluster: file.cluster,
            launch: file.launch,
            worker: file.worker,
            sweep: file.sweep.0,
            resources: None,
            sweep_is_list: index.contains("sweep[0]"),
            index,
        };
        if spec.sweep.is_empty() {
            // `sweep: []` planned no run and exited 0, as if a sweep had been run.
            return Err(spec.error_at("sweep", "the sweep is an empty list: give at least one block"));
        }
        spec.anchor_paths();
        spec.check()?;
        Ok(spec)
    }

    /// An error at a key path (placed at the key, or its nearest spelled-out ancestor).
    pub fn error_at(&self, key: &str, message: impl Into<String>) -> SpecError {
        let pos = self.index.find(key);
        SpecError {
            file: self.path.clone(),
            line: pos.map_or(1, |p| p.line),
            column: pos.map_or(1, |p| p.column),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// The key path of an axis of sweep block `block`.
    pub fn sweep_key(&self, block: usize, axis: &str) -> String {
        if self.sweep_is_list {
            format!("sweep[{block}].{axis}")
        } else {
            format!("sweep.{axis}")
        }
    }

    /// Switches the launch method (`zerobench local` runs any spec with `local`) and checks the
    /// spec again under the new method's rules.
    pub fn set_method(&mut self, method: Method) -> Result<(), SpecError> {
        self.launch.method = method;
        self.check()
    }

    /// Relative paths in the spec are relative to the spec's folder, made absolute: the runs start
    /// in their own folders (`local`, `sbatch`), where a path relative to the folder the command
    /// was given in leads nowhere, and `run.json` must not depend on that folder.
    fn anchor_paths(&mut self) {
        let base = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // `absolute` only joins the current folder (no file system access, links kept).
        let base = std::path::absolute(&base).unwrap_or(base);
        let anchor = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(p) = self.cluster.hostfile.as_mut() {
            anchor(p);
        }
        if let Some(serde_yaml::Value::String(p)) = self.worker.settings.get("data") {
            let mut p = PathBuf::from(p);
            anchor(&mut p);
            self.worker.data = Some(p);
        }
    }

    /// Every worker key is one `RunConfig` knows, under the name the spec uses for it, with a
    /// value of its type.
    fn check_worker(&self) -> Result<(), SpecError> {
        for key in self.worker.settings.keys() {
            if let Some(axis) = sweep_axis_of(key) {
                return Err(self.error_at(
                    &format!("worker.{key}"),
                    format!("is a sweep axis: set it in the sweep block as `{axis}`"),
                ));
            }
            if Worker::slot(key).is_none() {
                return Err(self.error_at(
                    &format!("worker.{key}"),
                    format!("unknown key `{key}`, expected one of {}, trace, profile_step", Worker::keys().join(", ")),
                ));
            }
        }
        let probe = RunConfig::new(ModelPreset::Tiny, ZeroStage::Z0);
        self.worker
            .apply(&probe, |_| false, &[])
            .map_err(|e| self.error_at(&format!("worker.{}", e.key), e.message))?;
        Ok(())
    }

    fn check(&mut self) -> Result<(), SpecError> {
        let c = &self.cluster;
        if c.cpus_per_task == 0 {
            return Err(self.error_at("cluster.cpus_per_task", "must be at least 1"));
        }
        if c.mem.is_some() && c.mem_per_cpu.is_some() {
            return Err(self.error_at(
                "cluster.mem_per_cpu",
                "Slurm takes --mem or --mem-per-cpu, not both: give cluster.mem or cluster.mem_per_cpu",
            ));
        }
        if c.cpus_per_node == Some(0) {
            return Err(self.error_at("cluster.cpus_per_node", "must be at least 1"));
        }
        // The names job.sbatch itself assigns, and bash's read-only variables: a spec's env that
        // set one would redirect the run (`run_dir` moved the logs outside the run folder while
        // `status` said done) or stop the script.
        const TAKEN: [&str; 11] = [
            "run_dir",
            "mpirun_root",
            "BASHOPTS",
            "BASH_VERSINFO",
            "EUID",
            "PPID",
            "SHELLOPTS",
            "UID",
            "BASHPID",
            "BASH_ARGV0",
            "GROUPS",
        ];
        if let Some(k) = c.env.keys().find(|k| TAKEN.contains(&k.as_str())) {
            return Err(self.error_at(
                &format!("cluster.env.{k}"),
                format!("{k} is a variable the job script sets itself (or bash keeps read-only): choose another name"),
            ));
        }
        // One argument or environment string may not exceed MAX_ARG_STRLEN (32 pages): a longer
        // value renders a script that cannot start.
        const MAX_STRING: usize = 128 * 1024;
        if let Some((k, _)) = c.env.iter().find(|(_, v)| v.len() >= MAX_STRING) {
            return Err(self.error_at(
                &format!("cluster.env.{k}"),
                format!("is longer than the {} KiB a process's environment string may hold", MAX_STRING / 1024),
            ));
        }
        if let Some((i, _)) = c.modules.iter().enumerate().find(|(_, m)| m.as_str().chars().any(char::is_control)) {
            return Err(self.error_at(
                &format!("cluster.modules[{i}]"),
                "contains a line break or control character, which `module load` cannot take",
            ));
        }
        if let Some((k, _)) = c.env.iter().find(|(_, v)| v.contains('\0')) {
            return Err(self
                .error_at(&format!("cluster.env.{k}"), "contains a NUL byte, which no environment variable can hold"));
        }
        if let Some(expr) = &c.nodelist {
            if expr.chars().any(char::is_control) {
                return Err(self.error_at("cluster.nodelist", "contains a line break or control character"));
            }
            let hosts = hostlist::expand(expr).map_err(|e| self.error_at("cluster.nodelist", e.to_string()))?;
            if let Some(h) = hosts.iter().find(|h| !crate::hostfile::valid_host(h)) {
                return Err(self.error_at("cluster.nodelist", format!("'{}' is not a host name", h.escape_debug())));
            }
            if hosts.is_empty() {
                return Err(self.error_at("cluster.nodelist", "names no hosts"));
            }
            if c.hostfile.is_some() {
                return Err(self.error_at("cluster.nodelist", "give either a nodelist or a hostfile, not both"));
            }
        }
        self.check_worker()?;
        if let Some(d) = &self.worker.data {
            // Every run of the sweep would fail on it; say so before anything is rendered.
            match std::fs::metadata(d) {
                Ok(m) if m.is_file() => {}
                Ok(_) => return Err(self.error_at("worker.data", format!("{} is not a regular file", d.display()))),
                Err(e) => {
                    return Err(self.error_at(
                        "worker.data",
                        format!("cannot read {} ({e}); a relative path is relative to the spec's folder", d.display()),
                    ))
                }
            }
        }
        for key in ["include", "exclude"] {
            let set = if key == "include" { c.include.is_some() } else { c.exclude.is_some() };
            if set && c.hostfile.is_none() {
                return Err(
                    self.error_at(&format!("cluster.{key}"), "filters a hostfile, but cluster.hostfile is not set")
                );
            }
        }
        if let Some(hf_path) = &c.hostfile {
            let filter = Filter::from_flags(c.include.as_deref(), c.exclude.as_deref())
                .map_err(|e| self.error_at("cluster.exclude", e.to_string()))?;
            let hf = Hostfile::read(hf_path, c.hostfile_format)
                .map_err(|e| self.error_at("cluster.hostfile", e.to_string()))?;
            let key = if c.include.is_some() { "cluster.include" } else { "cluster.exclude" };
            let res = Resources::select(&hf, filter).map_err(|e| self.error_at(key, e.to_string()))?;
            self.resources = Some(res);
        }
        match self.launch.method {
            Method::Pdsh if self.cluster.hostfile.is_none() => {
                return Err(self.error_at(
                    "launch.method",
                    "pdsh starts ranks over ssh on the hosts of a hostfile: set cluster.hostfile",
                ));
            }
            Method::Local if self.cluster.hostfile.is_some() => {
                return Err(
                    self.error_at("cluster.hostfile", "the local method runs on this host only; remove the hostfile")
                );
            }
            _ => {}
        }
        if self.cluster.allocation.is_some() {
            if !matches!(self.launch.method, Method::Srun | Method::Torchrun) {
                return Err(self.error_at(
                    "cluster.allocation",
                    format!(
                        "runs in an allocation are srun job steps (methods srun, torchrun), but launch.method is {}",
                        self.launch.method
                    ),
                ));
            }
            if self.cluster.hostfile.is_some() || self.cluster.nodelist.is_some() {
                return Err(self
                    .error_at("cluster.allocation", "the allocation decides the hosts: remove hostfile and nodelist"));
            }
        }
        if self.launch.worker.as_str().starts_with('-') {
            return Err(self.error_at(
                "launch.worker",
                "a program path cannot start with '-' (the launcher would read it as an option)",
            ));
        }
        if !self.launch.method.rendezvous_by_env() && self.launch.master_port.is_some() {
            return Err(self.error_at("launch.master_port", "only the pdsh and torchrun methods use a rendezvous port"));
        }
        if self.launch.ssh_port.is_some()
            && (self.launch.method, self.launch.pdsh_rcmd) != (Method::Pdsh, PdshRcmd::Ssh)
        {
            return Err(
                self.error_at("launch.ssh_port", "only the pdsh method over ssh (pdsh_rcmd: ssh) uses an ssh port")
            );
        }
        if self.launch.ssh_port == Some(0) {
            return Err(self.error_at("launch.ssh_port", "must be a port number from 1 to 65535"));
        }
        for (b, block) in self.sweep.iter().enumerate() {
            self.check_block(b, block)?;
        }
        Ok(())
    }

    fn check_block(&self, b: usize, block: &SweepBlock) -> Result<(), SpecError> {
        fn axis<T: PartialEq + fmt::Display>(
            spec: &Spec,
            key: String,
            v: Option<&OneOrMany<T>>,
        ) -> Result<(), SpecError> {
            let Some(v) = v else { return Ok(()) };
            if v.0.is_empty() {
                return Err(spec.error_at(&key, "lists no values (leave the key out for its default)"));
            }
            for (i, x) in v.0.iter().enumerate() {
                if v.0[..i].contains(x) {
                    return Err(spec.error_at(&format!("{key}[{i}]"), format!("{x} is listed twice")));
                }
            }
            Ok(())
        }
        let key = |a: &str| self.sweep_key(b, a);
        axis(self, key("models"), Some(&block.models))?;
        axis(self, key("stages"), block.stages.as_ref())?;
        axis(self, key("offload"), block.offload.as_ref())?;
        axis(self, key("offload_ratio"), block.offload_ratio.as_ref())?;
        axis(self, key("precision"), block.precision.as_ref())?;
        axis(self, key("micro_batches"), block.micro_batches.as_ref())?;
        axis(self, key("nodes"), block.nodes.as_ref())?;
        axis(self, key("gpus_per_node"), block.gpus_per_node.as_ref())?;
        axis(self, key("grad_accum"), block.grad_accum.as_ref())?;
        axis(self, key("hpz"), block.hpz.as_ref())?;
        axis(self, key("prefetch"), block.prefetch.as_ref())?;
        axis(self, key("bucket_mb"), block.bucket_mb.as_ref())?;
        for axis in block.knob_axes() {
            let field = axis[0].field;
            if self.worker.sets(field) {
                return Err(self.error_at(
                    &key(field),
                    format!(
                        "worker.{field} fixes it for every run: set it in one place, the worker block or the sweep"
                    ),
                ));
            }
        }
        // RunConfig::validate refuses these too, but only when the plan is built, and at the axis
        // key (a zero gpus_per_node at `nodes`, through the world size); here the error points at
        // the value itself.
        for (name, v) in
            [("micro_batches", &block.micro_batches), ("nodes", &block.nodes), ("gpus_per_node", &block.gpus_per_node)]
        {
            if let Some(i) = v.as_ref().and_then(|v| v.0.iter().position(|&x| x == 0)) {
                return Err(self.error_at(&format!("{}[{i}]", key(name)), "must be at least 1"));
            }
        }
        let gpus = self.cluster.gpus_per_node;
        for (i, &r) in self.ranks_axis(block).iter().enumerate() {
            let at = format!("{}[{i}]", key("gpus_per_node"));
            if gpus > 0 && r > gpus {
                return Err(self.error_at(
                    &at,
                    format!("{r} ranks per node, but cluster.gpus_per_node is {gpus} (one rank per GPU)"),
                ));
            }
            if let Some(cpus) = self.cluster.cpus_per_node {
                let need = u64::from(r) * u64::from(self.cluster.cpus_per_task);
                if need > u64::from(cpus) {
                    return Err(self.error_at(
                        &at,
                        format!(
                            "{r} ranks × cluster.cpus_per_task {} = {need} CPUs, but cluster.cpus_per_node is {cpus}",
                            self.cluster.cpus_per_task
                        ),
                    ));
                }
            }
        }
        for (i, &n) in self.nodes_axis(block).iter().enumerate() {
            let at = format!("{}[{i}]", key("nodes"));
            if self.launch.method == Method::Local && n > 1 {
                return Err(self.error_at(&at, format!("{n} nodes, but the local method runs on this host only")));
            }
            if let Some(res) = &self.resources {
                if n as usize > res.hosts.len() {
                    return Err(self.error_at(
                        &at,
                        format!("{n} nodes, but the hostfile (after include/exclude) has {}", res.hosts.len()),
                    ));
                }
                for &r in &self.ranks_axis(block) {
                    if let Some(h) = res.hosts[..n as usize].iter().find(|h| h.slots.len() < r as usize) {
                        return Err(self.error_at(
                            &at,
                            format!(
                                "{n} nodes × {r} ranks, but host '{}' has only {} usable slots",
                                h.host,
                                h.slots.len()
                            ),
                        ));
                    }
                    self.check_slots_honoured(&res.hosts[..n as usize], r)?;
                }
            }
        }
        Ok(())
    }

    /// Only pdsh starts each rank on the GPU its slot names (node.sh exports the node's selected
    /// slots); mpirun, srun and torchrun start a host's R ranks on its GPUs 0..R-1, each rank by
    /// its local rank. A selection of other slots (`exclude: worker-0:0` to avoid a bad GPU) would
    /// be silently ignored there, so it is refused.
    fn check_slots_honoured(&self, hosts: &[crate::select::HostSlots], ranks: u32) -> Result<(), SpecError> {
        if self.launch.method == Method::Pdsh || self.cluster.gpus_per_node == 0 {
            return Ok(());
        }
        let first: Vec<u32> = (0..ranks).collect();
        match hosts.iter().find(|h| h.slots.iter().take(ranks as usize).copied().ne(first.iter().copied())) {
            None => Ok(()),
            Some(h) => {
                let key = if self.cluster.include.is_some() { "cluster.include" } else { "cluster.exclude" };
                let taken: Vec<String> = h.slots.iter().take(ranks as usize).map(u32::to_string).collect();
                Err(self.error_at(
                    key,
                    format!(
                        "selects GPUs {} of host '{}' for its {ranks} ranks, but launch.method {} starts them on \
                         GPUs 0-{}; only pdsh starts ranks on the selected GPUs: use it, or select whole hosts",
                        taken.join(","),
                        h.host,
                        self.launch.method,
                        ranks - 1
                    ),
                ))
            }
        }
    }

    /// The ranks-per-node axis of a block with its default: every GPU of a node, or one rank on
    /// CPU nodes.
    pub fn ranks_axis(&self, block: &SweepBlock) -> Vec<u32> {
        axis_or(block.gpus_per_node.as_ref(), &[self.cluster.gpus_per_node.max(1)])
    }

    /// The nodes axis of a block with its default, one node.
    pub fn nodes_axis(&self, block: &SweepBlock) -> Vec<u32> {
        axis_or(block.nodes.as_ref(), &[1])
    }
}

/// A sweep axis's values, or `default` when the block leaves the key out.
pub fn axis_or<T: Clone>(axis: Option<&OneOrMany<T>>, default: &[T]) -> Vec<T> {
    axis.map_or_else(|| default.to_vec(), |v| v.0.clone())
}

/// serde_yaml's error, placed. serde_yaml names the enclosing key path in its message, but for
/// a value that fails its own check that is the parent; the index names the exact key at the
/// position instead.
/// The deepest a spec's `[...]`/`{...}` may nest: a real spec nests two or three levels, and the
/// YAML parsers take quadratic time in the depth (100,000 levels took 27 s to refuse).
pub const MAX_FLOW_DEPTH: usize = 64;

/// Refuses a spec whose flow collections nest deeper than [`MAX_FLOW_DEPTH`], before any parser
/// sees it. Brackets inside quoted strings and comments do not count.
fn flow_depth(text: &str, path: &Path) -> Result<(), SpecError> {
    let (mut depth, mut quote, mut comment) = (0usize, None::<char>, false);
    let (mut line, mut column) = (1usize, 0usize);
    let mut prev = '\n';
    for ch in text.chars() {
        column += 1;
        match (quote, ch) {
            (_, '\n') => {
                line += 1;
                column = 0;
                comment = false;
            }
            _ if comment => {}
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '#') if prev.is_whitespace() => comment = true,
            (None, '"' | '\'') => quote = Some(ch),
            (None, '[' | '{') => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(SpecError {
                        file: path.to_path_buf(),
                        line,
                        column,
                        key: String::new(),
                        message: format!("nested more than {MAX_FLOW_DEPTH} levels deep"),
                    });
                }
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        prev = ch;
    }
    Ok(())
}

/// serde's messages in the words of the spec: a negative count is not an "integer, expected u32",
/// and `ranks_per_node` (the other name of `gpus_per_node`) given twice is not a duplicate field.
fn plain_words(message: &str) -> String {
    static NEGATIVE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"invalid (?:value|type): integer `(-[0-9]+)`, expected u(?:8|16|32|64)")
            .expect("valid regex")
    });
    static NOT_A_NUMBER: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"invalid type: (.+), expected u(?:8|16|32|64)$").expect("valid regex")
    });
    if let Some(c) = NEGATIVE.captures(message) {
        return NEGATIVE.replace(message, format!("must be a whole number of at least 0, not {}", &c[1])).into_owned();
    }
    if let Some(c) = NOT_A_NUMBER.captures(message) {
        return NOT_A_NUMBER
            .replace(message, format!("must be a whole number of at least 0, not {}", &c[1]))
            .into_owned();
    }
    if message.contains("duplicate field `gpus_per_node`") {
        return "gpus_per_node and ranks_per_node are two names for one setting: give one of them".into();
    }
    message.to_string()
}

fn yaml_error(path: &Path, index: &KeyIndex, e: &serde_yaml::Error) -> SpecError {
    let mut message = e.to_string();
    let Some(loc) = e.location() else {
        return SpecError { file: path.to_path_buf(), line: 1, column: 1, key: String::new(), message };
    };
    // serde_yaml appends " at line L column C"; the position goes in front instead.
    if let Some(i) = message.rfind(" at line ") {
        message.truncate(i);
    }
    let mut pos = Pos { line: loc.line(), column: loc.column() };
    message = plain_words(&message);
    // serde places a duplicate at its mapping; the second spelling is where the user looks.
    if message.starts_with("gpus_per_node and ranks_per_node") {
        let parent = index.key_at(pos).and_then(|k| k.rsplit_once('.').map(|(p, _)| p.to_string()));
        if let Some(at) = parent.and_then(|p| index.find(&format!("{p}.ranks_per_node"))) {
            pos = at;
        }
    }
    let mut key = String::new();
    if let Some(k) = index.key_at(pos) {
        // Drop serde_yaml's "path: " prefix when it is the exact key or one of its ancestors.
        if let Some((prefix, rest)) = message.split_once(": ") {
            if !prefix.contains(' ') && k.starts_with(prefix) {
                message = rest.to_string();
            }
        }
        key = k.to_string();
    }
    SpecError { file: path.to_path_buf(), line: pos.line, column: pos.column, key, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules between keys: the local method takes no hostfile (also when a spec is switched to
    /// it), an allocation decides the hosts (no hostfile, no nodelist), ranks times CPUs per
    /// rank fit a node's CPUs exactly, and an empty axis says what an axis takes.
    #[test]
    fn keys_that_exclude_each_other_are_refused() {
        let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hostfiles/openmpi.txt");
        let with_hostfile = format!(
            "cluster: {{hostfile: {}, hostfile_format: openmpi}}\nlaunch: {{method: mpirun}}\nsweep: {{models: tiny}}\n",
            hf.display()
        );
        let mut s = Spec::parse(&with_hostfile, Path::new("s.yaml")).unwrap();
        let e = s.set_method(Method::Local).unwrap_err().to_string();
        assert!(e.contains("cluster.hostfile: the local method runs on this host only; remove the hostfile"), "{e}");
        let e = err(&with_hostfile.replace("method: mpirun", "method: local"));
        assert!(e.contains("the local method runs on this host only"), "{e}");
        let e = err("cluster: {allocation: current, nodelist: 'n[1-2]'}\nsweep: {models: tiny}\n");
        assert!(e.contains("the allocation decides the hosts: remove hostfile and nodelist"), "{e}");
        let cpus = |r: u32| {
            format!("cluster: {{cpus_per_node: 8, cpus_per_task: 4}}\nsweep: {{models: tiny, ranks_per_node: {r}}}\n")
        };
        assert!(parse(&cpus(2)).is_ok(), "8 CPUs for 2 ranks of 4");
        assert!(err(&cpus(3)).contains("3 ranks × cluster.cpus_per_task 4 = 12 CPUs, but cluster.cpus_per_node is 8"));
        assert!(err("sweep: {models: ~}\n").contains("expected a value or a list of values"));
        assert!(err("sweep: []\n").contains("sweep: the sweep is an empty list"));
        let e = err("worker:\n  steps: 3\n  steps: 500\nsweep:\n  models: tiny\n");
        assert!(e.contains(":3:3: worker.steps: given twice (first at line 2)"), "{e}");
    }

    /// Flow nesting is counted outside quotes and comments (a comment ends with its line), and
    /// the refusal names the line and column of the bracket one level too deep.
    #[test]
    fn nesting_depth_counts_brackets_outside_quotes_and_comments_by_line() {
        let deep = "[".repeat(MAX_FLOW_DEPTH + 1);
        let e = err(&format!("sweep:\n  models: tiny\n# {deep}\nx: {deep}\n"));
        assert!(
            e.starts_with(&format!("s.yaml:4:{}: ", 3 + MAX_FLOW_DEPTH + 1)) && e.contains("nested more than"),
            "{e}"
        );
        let quoted = parse(&format!("cluster: {{partition: '{deep}'}}\nsweep: {{models: tiny}}\n"));
        assert!(quoted.err().is_none_or(|e| !e.to_string().contains("nested more than")));
        let commented = parse(&format!("sweep: {{models: tiny}} # {deep}\n"));
        assert!(commented.err().is_none_or(|e| !e.to_string().contains("nested more than")));
        // A quote ends at its closing quote: the brackets after it count.
        assert!(err(&format!("cluster: {{partition: 'x'}}\nsweep: {{models: tiny}}\nx: {deep}\n"))
            .contains("nested more than"));
        // A '#' inside a word does not start a comment (YAML's rule): the brackets after it count.
        assert!(err(&format!("sweep: {{models: tiny}}\nx: a#{deep}\n")).contains("nested more than"));
        // Many collections side by side are one level each.
        let flat = parse(&format!("sweep: {{models: tiny}}\nx: [{}]\n", vec!["[]"; MAX_FLOW_DEPTH + 1].join(", ")));
        assert!(flat.err().is_none_or(|e| !e.to_string().contains("nested more than")));
    }

    /// A method's text is the name the spec gives it, both ways.
    #[test]
    fn methods_are_written_as_the_spec_names_them() {
        for name in ["srun", "mpirun", "pdsh", "torchrun", "local"] {
            let m: Method = serde_json::from_str(&format!("\"{name}\"")).unwrap();
            assert_eq!((m.as_str(), m.to_string()), (name, name.to_string()));
        }
    }

    /// Values a script cannot run with are refused at their key: an env name the script sets
    /// itself, an env value past the kernel's limit, a module name with a line break.
    #[test]
    fn values_the_script_cannot_take_are_refused() {
        let err = |t: &str| Spec::parse(t, Path::new("s.yaml")).unwrap_err().to_string();
        let e = err("cluster:\n  env:\n    run_dir: /elsewhere\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:3:5: cluster.env.run_dir: run_dir is a variable the job script sets"), "{e}");
        assert!(err("cluster:\n  env:\n    EUID: 0\nsweep:\n  models: tiny\n").contains("cluster.env.EUID"));
        let big = format!("cluster:\n  env:\n    BIG: {}\nsweep:\n  models: tiny\n", "x".repeat(200_000));
        assert!(err(&big).contains("cluster.env.BIG: is longer than the 128 KiB"));
        let e = err("cluster:\n  modules: [\"gcc\\r\\n\"]\nsweep:\n  models: tiny\n");
        assert!(e.contains("cluster.modules[0]: contains a line break"), "{e}");
    }

    /// Deep nesting is refused at once, before a parser takes quadratic time over it; brackets
    /// in strings do not count.
    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let deep = format!("sweep: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let e = Spec::parse(&deep, Path::new("s.yaml")).unwrap_err().to_string();
        assert_eq!(e, "s.yaml:1:72: nested more than 64 levels deep");
        let text = format!("cluster:\n  modules: [\"{}\"]\nsweep:\n  models: tiny\n", "[".repeat(200));
        Spec::parse(&text, Path::new("s.yaml")).unwrap();
    }

    /// Errors name the key the user wrote, and a negative count gets a sentence.
    #[test]
    fn messages_in_the_words_of_the_spec() {
        let err = |t: &str| Spec::parse(t, Path::new("s.yaml")).unwrap_err().to_string();
        assert_eq!(
            err("sweep:\n  models: tiny\n  ranks_per_node: -1\n"),
            "s.yaml:3:19: sweep.ranks_per_node: must be a whole number of at least 0, not -1"
        );
        assert_eq!(
            err("sweep:\n  models: tiny\n  ranks_per_node: 2\n  gpus_per_node: 2\n"),
            "s.yaml:3:3: sweep.ranks_per_node: gpus_per_node and ranks_per_node are two names for one setting: give one of them"
        );
        assert!(err("cluster:\n  cpus_per_task: -3\nsweep:\n  models: tiny\n").ends_with("not -3"));
    }

    /// A data file that is not there fails every run: refused before rendering, naming the key
    /// and where a relative path points.
    #[test]
    fn a_missing_data_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let spec = d.path().join("s.yaml");
        let text = "worker:\n  data: text.txt\nsweep:\n  models: tiny\n";
        let e = Spec::parse(text, &spec).unwrap_err().to_string();
        assert!(e.contains("worker.data") && e.contains("relative to the spec's folder"), "{e}");
        std::fs::write(d.path().join("text.txt"), "some text").unwrap();
        let s = Spec::parse(text, &spec).unwrap();
        assert_eq!(s.worker.data.as_deref(), Some(d.path().join("text.txt").as_path()));
        std::fs::create_dir(d.path().join("folder")).unwrap();
        let e = Spec::parse("worker:\n  data: folder\nsweep:\n  models: tiny\n", &spec).unwrap_err().to_string();
        assert!(e.contains("is not a regular file"), "{e}");
    }

    /// mpirun, srun and torchrun start a host's ranks on its GPUs 0..R-1 whatever include or
    /// exclude select: a selection of other GPUs is refused there (it was silently ignored: a
    /// bad GPU excluded was used), and taken by pdsh, whose node.sh starts ranks on them.
    #[test]
    fn slots_only_pdsh_can_honour_are_refused_for_the_other_methods() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("hosts"), "worker-0 slots=4\nworker-1 slots=4\n").unwrap();
        let spec = d.path().join("s.yaml");
        let text = |method: &str, filter: &str| {
            format!(
                "cluster:\n  gpus_per_node: 4\n  hostfile: hosts\n  {filter}\nlaunch:\n  method: {method}\n\
                 sweep:\n  models: tiny\n  nodes: 2\n  gpus_per_node: 2\n"
            )
        };
        for method in ["mpirun", "srun", "torchrun"] {
            let e = Spec::parse(&text(method, "include: worker-0:2,3@worker-1:2,3"), &spec).unwrap_err().to_string();
            assert!(e.contains("cluster.include: selects GPUs 2,3 of host 'worker-0' for its 2 ranks"), "{e}");
            assert!(e.contains(&format!("launch.method {method} starts them on GPUs 0-1")), "{e}");
            let e = Spec::parse(&text(method, "exclude: worker-1:0"), &spec).unwrap_err().to_string();
            assert!(e.contains("cluster.exclude: selects GPUs 1,2 of host 'worker-1'"), "{e}");
            // The first GPUs of every host, or whole hosts: what the method does anyway.
            Spec::parse(&text(method, "exclude: worker-0:3@worker-1:3"), &spec).unwrap();
            Spec::parse(&text(method, "include: worker-0@worker-1"), &spec).unwrap();
        }
        Spec::parse(&text("pdsh", "include: worker-0:2,3@worker-1:2,3"), &spec).unwrap();
    }

    /// A spec named by a relative path (`zerobench local exp/spec.yaml`) gives the runs, which
    /// start in their own folders, an absolute data path: `exp/text.txt` failed every run (exit
    /// 5), and made `run.json` depend on the folder the command was given in.
    #[test]
    fn relative_paths_of_a_spec_named_relatively_become_absolute() {
        let d = tempfile::tempdir_in(".").unwrap();
        std::fs::write(d.path().join("text.txt"), "some text").unwrap();
        std::fs::write(d.path().join("hosts"), "n1 slots=1\n").unwrap();
        let name = d.path().file_name().unwrap();
        let want = |f: &str| std::env::current_dir().unwrap().join(name).join(f);
        for spec in [Path::new(name).join("s.yaml"), Path::new(".").join(name).join("s.yaml")] {
            assert!(spec.is_relative());
            let text = "cluster:\n  hostfile: hosts\nworker:\n  data: text.txt\nsweep:\n  models: tiny\n";
            let s = Spec::parse(text, &spec).unwrap();
            assert_eq!(s.worker.data.as_deref(), Some(want("text.txt").as_path()), "{spec:?}");
            assert_eq!(s.cluster.hostfile.as_deref(), Some(want("hosts").as_path()), "{spec:?}");
        }
        // A spec in the current folder itself (its parent is the empty path).
        let text = tempfile::NamedTempFile::new_in(".").unwrap();
        let file = text.path().file_name().unwrap().to_str().unwrap();
        let s = Spec::parse(&format!("worker:\n  data: {file}\nsweep:\n  models: tiny\n"), Path::new("s.yaml"));
        assert_eq!(s.unwrap().worker.data.unwrap(), std::env::current_dir().unwrap().join(file));
    }

    fn parse(text: &str) -> Result<Spec, SpecError> {
        Spec::parse(text, Path::new("s.yaml"))
    }

    fn err(text: &str) -> String {
        parse(text).expect_err(text).to_string()
    }

    #[test]
    fn minimal_spec_and_defaults() {
        let s = parse("sweep:\n  models: tiny\n").unwrap();
        assert_eq!(s.launch.method, Method::Srun);
        assert_eq!(s.launch.mpi.as_str(), "pmix");
        assert_eq!(s.sweep[0].models.0, vec![ModelPreset::Tiny]);
        assert_eq!(s.ranks_axis(&s.sweep[0]), vec![1]);
        assert_eq!(s.sweep_key(0, "stages"), "sweep.stages");
        let l = parse("sweep:\n  - models: [tiny]\n  - models: gpt2\n    stages: 3\n").unwrap();
        assert_eq!(l.sweep.len(), 2);
        assert_eq!(l.sweep_key(1, "stages"), "sweep[1].stages");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key_and_line() {
        let e = err("cluster:\n  partition: gpu\n  nodez: 2\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:3:3: cluster.nodez: unknown field `nodez`, expected one of"), "{e}");
        let e = err("sweep:\n  models: tiny\n  stages: [0, 4]\n");
        assert!(e.starts_with("s.yaml:3:"), "{e}");
        assert!(e.contains("sweep.stages") && e.contains("0, 1, 2 or 3"), "{e}");
        let e = err("cluster:\n  partition: \"gpu; rm -rf /\"\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:2:") && e.contains("cluster.partition") && e.contains("Slurm names"), "{e}");
        let e = err("cluster:\n  time: 1h\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:2:") && e.contains("cluster.time"), "{e}");
        let e = err("cluster:\n  env:\n    BAD-NAME: x\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:3:") && e.contains("environment variable name"), "{e}");
        let e = err("sweep:\n  models: gpt3\n");
        assert!(e.starts_with("s.yaml:2:") && e.contains("gpt2-xl"), "{e}");
        let e = err("cluster: {}\n");
        assert!(e.contains("missing field `sweep`"), "{e}");
        let e = err("sweep: [");
        assert!(e.starts_with("s.yaml:1:") || e.starts_with("s.yaml:2:"), "{e}");
        assert!(err("").contains("s.yaml:1:1"));
    }

    #[test]
    fn rules_across_keys_are_placed() {
        let e = err("cluster:\n  gpus_per_node: 4\nsweep:\n  models: gpt2\n  gpus_per_node: [2, 8]\n");
        assert!(e.starts_with("s.yaml:5:") && e.contains("sweep.gpus_per_node[1]: 8 ranks per node"), "{e}");
        let e = err("sweep:\n  models: tiny\n  micro_batches: [1, 0]\n");
        assert!(e.contains("sweep.micro_batches[1]: must be at least 1"), "{e}");
        let e = err("sweep:\n  - models: tiny\n  - models: tiny\n    stages: [1, 1]\n");
        assert!(e.starts_with("s.yaml:4:") && e.contains("sweep[1].stages[1]: 1 is listed twice"), "{e}");
        let e = err("launch:\n  method: pdsh\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:2:3: launch.method: pdsh"), "{e}");
        let e = err("launch:\n  method: local\nsweep:\n  models: tiny\n  nodes: [1, 2]\n");
        assert!(e.contains("sweep.nodes[1]: 2 nodes, but the local method"), "{e}");
        let e = err("cluster:\n  include: a\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:2:3: cluster.include"), "{e}");
        let e = err("cluster:\n  nodelist: n[1-3\nsweep:\n  models: tiny\n");
        assert!(e.contains("cluster.nodelist: invalid hostlist"), "{e}");
        let e = err("cluster:\n  cpus_per_node: 4\n  cpus_per_task: 3\nsweep:\n  models: tiny\n  ranks_per_node: 2\n");
        assert!(e.contains("= 6 CPUs"), "{e}");
        let e = err("cluster:\n  allocation: 12\nlaunch:\n  method: mpirun\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:2:3: cluster.allocation: runs in an allocation are srun job steps"), "{e}");
        let e = err("cluster:\n  allocation: yesterday\nsweep:\n  models: tiny\n");
        assert!(e.contains("cluster.allocation") && e.contains("'yesterday' is not a job id or 'current'"), "{e}");
        assert_eq!(
            parse("cluster: {allocation: current}\nsweep: {models: tiny}\n").unwrap().cluster.allocation,
            Some(Allocation::Current)
        );
        assert_eq!(
            parse("cluster: {allocation: '42'}\nsweep: {models: tiny}\n").unwrap().cluster.allocation,
            Some(Allocation::Job(42))
        );
        // The ssh port belongs to pdsh over ssh (the pdsh cases: `ssh_port_is_pdsh_over_ssh_only`).
        let e = err("launch:\n  method: srun\n  ssh_port: 2222\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:3:3: launch.ssh_port: only the pdsh method over ssh"), "{e}");
        let e = err("cluster:\n  hostfile: /nonexistent/hf\nsweep:\n  models: tiny\n");
        assert!(e.contains("cluster.hostfile: /nonexistent/hf: cannot read"), "{e}");
    }

    /// `launch.ssh_port` goes with pdsh over ssh only, and is a port number.
    #[test]
    fn ssh_port_is_pdsh_over_ssh_only() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("hosts"), "a slots=1\nb slots=1\n").unwrap();
        let load = |launch: &str| {
            let text = format!("cluster: {{hostfile: hosts}}\nlaunch: {launch}\nsweep: {{models: tiny}}\n");
            Spec::parse(&text, &d.path().join("s.yaml")).map_err(|e| e.to_string())
        };
        assert_eq!(load("{method: pdsh, ssh_port: 2222}").unwrap().launch.ssh_port, Some(2222));
        let e = load("{method: pdsh, pdsh_rcmd: exec, ssh_port: 2222}").unwrap_err();
        assert!(e.contains("launch.ssh_port: only the pdsh method over ssh (pdsh_rcmd: ssh)"), "{e}");
        let e = load("{method: pdsh, ssh_port: 0}").unwrap_err();
        assert!(e.contains("launch.ssh_port: must be a port number from 1 to 65535"), "{e}");
        let e = load("{method: pdsh, ssh_port: 70000}").unwrap_err();
        assert!(e.contains("launch.ssh_port"), "{e}");
    }

    /// The torchrun method: srun steps meeting at a rendezvous port, in an allocation too.
    #[test]
    fn torchrun_takes_a_port_and_an_allocation() {
        let s = parse(
            "cluster: {allocation: '42'}\nlaunch: {method: torchrun, master_port: 29611}\nsweep: {models: tiny}\n",
        )
        .unwrap();
        assert_eq!((s.launch.method, s.launch.master_port), (Method::Torchrun, Some(29611)));
        let e = err("launch:\n  method: srun\n  master_port: 29611\nsweep:\n  models: tiny\n");
        assert!(e.contains("launch.master_port: only the pdsh and torchrun methods use a rendezvous port"), "{e}");
    }

    /// serde_yaml's "path: " prefix is dropped only when it is the key's path: a value that holds
    /// ": " itself stays whole in its message.
    #[test]
    fn a_value_with_a_colon_stays_whole_in_its_error() {
        let e = err("cluster:\n  partition: 'a:b: c'\nsweep:\n  models: tiny\n");
        assert!(e.starts_with("s.yaml:2:") && e.contains("'a:b: c' contains ':'"), "{e}");
    }
}
