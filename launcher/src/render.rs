//! A plan to run folders: `job.sbatch`, the hostfile the method reads, pdsh's per-node script,
//! and `run.json` with the resolved configuration.
//!
//! Scripts are built with plain string writes, top to bottom in the order they read, so the
//! template is the code. Every user value passes through [`crate::quote`]; ids, numbers and the
//! renderer's own flags are safe by construction.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::hostfile::{HostEntry, Hostfile, HostfileFormat};
use crate::hostlist;
use crate::plan::{Plan, Run};
use crate::quote::{sbatch_value, sh, sh_arg, slurm_pattern_literal, DirectiveError};
use crate::select::Resources;
use crate::spec::{Allocation, Cluster, Launch, Method, MpiImpl, PdshRcmd};
use zerobench_schema::launch::{ENV_RENDEZVOUS_ARGS, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE};

pub use zerobench_schema::job::RUN_RECORD_VERSION;

/// The resolved configuration of one run, as written to `run.json`. `submit`, `status` and
/// ingest read it back, so it names everything needed to understand the run without the spec.
/// The planned run's fields sit at the top level of the JSON, beside the rendering's own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub format: u32,
    #[serde(flatten)]
    pub run: Run,
    /// `run.world_size()`, written out for readers without the launcher (ingest, scripts).
    pub world_size: u32,
    /// The spec it was rendered from.
    pub spec: PathBuf,
    pub zerobench_version: String,
    pub method: Method,
    pub cluster: Cluster,
    pub launch: Launch,
    /// What one rank runs.
    pub worker_argv: Vec<String>,
    /// What starts the ranks (as `job.sbatch` runs it).
    pub launch_argv: Vec<String>,
    /// The folder the ranks write their logs to.
    pub log_dir: PathBuf,
}

/// The files of one run folder, before they are written.
#[derive(Debug, Clone)]
pub struct RunFiles {
    pub script: String,
    /// pdsh's per-node launcher, `node.sh`.
    pub node_script: Option<String>,
    pub hostfile: Option<(HostfileFormat, String)>,
    pub record: RunRecord,
}

impl RunFiles {
    pub fn run_json(&self) -> String {
        // RunRecord holds only strings, numbers and maps with string keys: it always serializes.
        serde_json::to_string_pretty(&self.record).unwrap_or_default() + "\n"
    }
}

/// What the ranks' log folder is called inside a run folder.
pub const LOG_DIR: &str = "logs";

/// Where a run folder keeps the logs and records of earlier attempts (hidden: `status` and
/// `ingest` read the current attempt): `--retry-failed`'s, and a requeued job's.
pub const ATTEMPTS_DIR: &str = ".attempts";

/// One word of a rendered command: a literal (quoted for bash), a path in the run folder
/// (written from `$run_dir`), or the root guard's expansion. Keeping them apart gives both the
/// shell text and the real argv (`run.json`'s `launch_argv`) from one list.
#[derive(Debug, Clone)]
enum Word {
    Lit(String),
    InRunDir(String),
    RootGuard,
}

impl Word {
    fn lit(s: impl Into<String>) -> Self {
        Word::Lit(s.into())
    }
    fn shell(&self) -> String {
        match self {
            Word::Lit(s) => sh_arg(s).into_owned(),
            // `rel` is one of the renderer's own file names.
            Word::InRunDir(rel) => format!("\"$run_dir/{rel}\""),
            Word::RootGuard => "\"${mpirun_root[@]}\"".into(),
        }
    }
    fn argv(&self, dir: &str) -> Option<String> {
        match self {
            Word::Lit(s) => Some(s.clone()),
            Word::InRunDir(rel) => Some(format!("{dir}/{rel}")),
            Word::RootGuard => None,
        }
    }
}

/// The real argv of `words` for the run folder `dir` (the root guard expands to nothing here).
fn argv(words: &[Word], dir: &str) -> Vec<String> {
    words.iter().filter_map(|w| w.argv(dir)).collect()
}

/// Renders one run for the folder `run_dir` (absolute; nothing is written).
pub fn render_run(plan: &Plan, run: &Run, run_dir: &Path) -> Result<RunFiles, DirectiveError> {
    let spec = &plan.spec;
    let (cluster, launch) = (&spec.cluster, &spec.launch);
    let dir = run_dir.to_string_lossy();
    // The log folder is written from `$run_dir` in the scripts and spelled out in `run.json`.
    let mut worker = vec![Word::lit(launch.worker.as_str())];
    worker.extend(run.config.to_worker_args().into_iter().map(Word::Lit));
    worker.extend(spec.worker.observe_args().into_iter().map(Word::Lit));
    worker.extend([Word::lit("--log-dir"), Word::InRunDir(LOG_DIR.into()), Word::lit("--run-id"), Word::lit(&run.id)]);
    if launch.method.rendezvous_by_env() {
        worker.extend(ENV_RENDEZVOUS_ARGS.map(Word::lit));
    }

    let hostfile = run.hosts.as_ref().and_then(|res| {
        let format = match (launch.method, launch.mpi_impl) {
            (Method::Pdsh, _) => HostfileFormat::Deepspeed,
            (Method::Mpirun, MpiImpl::Openmpi) => HostfileFormat::Openmpi,
            (Method::Mpirun, MpiImpl::Mpich) => HostfileFormat::Mpich,
            _ => return None,
        };
        let hf = Hostfile {
            hosts: res
                .hosts
                .iter()
                .map(|h| HostEntry { host: h.host.clone(), slots: h.slots.len() as u32, max_slots: None })
                .collect(),
        };
        Some((format, hf.render(format)))
    });

    let mut s = String::with_capacity(2048);
    s.push_str("#!/bin/bash\n");
    let output = format!("{}/%x-%j.out", slurm_pattern_literal("the run folder", &dir)?);
    directives(&mut s, run, cluster, &run.id, &output)?;
    let _ = writeln!(
        s,
        "#\n# zerobench run {}: {} ZeRO-{}, offload {}, {}, micro-batch {}, {} node(s) x {} rank(s), method {}.\n\
         # Rendered by zerobench {}; run.json beside this file holds the resolved configuration.",
        run.id,
        run.config.model,
        run.config.stage,
        run.config.offload,
        run.config.precision,
        run.config.micro_batch,
        run.nodes,
        run.ranks_per_node,
        launch.method,
        env!("CARGO_PKG_VERSION"),
    );
    s.push_str("set -euo pipefail\n\n");
    let _ = writeln!(s, "run_dir={}", sh(&dir));
    restart_guard(&mut s);
    let _ = writeln!(s, "mkdir -p \"$run_dir/{LOG_DIR}\"");
    environment(&mut s, cluster);
    s.push('\n');

    let hostfile_format = hostfile.as_ref().map(|h| h.0);
    let (words, node_script) = match (launch.method, launch.mpi_impl) {
        (Method::Srun | Method::Torchrun, _) => (srun(&mut s, spec, run, &worker), None),
        (Method::Mpirun, MpiImpl::Openmpi) => {
            allocation_guard(&mut s, run, "mpirun");
            (openmpi(&mut s, cluster, run, &worker, Placement::PerNode(hostfile_format)), None)
        }
        (Method::Mpirun, MpiImpl::Mpich) => {
            allocation_guard(&mut s, run, "mpiexec");
            (mpich(&mut s, cluster, run, &worker, hostfile_format), None)
        }
        (Method::Local, _) => (openmpi(&mut s, cluster, run, &worker, Placement::ThisHost), None),
        (Method::Pdsh, _) => {
            let res = run.hosts.as_ref().ok_or_else(|| DirectiveError {
                what: "pdsh hosts",
                value: String::new(),
                why: "the pdsh method needs a hostfile",
            })?;
            allocation_guard(&mut s, run, "pdsh");
            let (words, node) = pdsh(&mut s, spec, run, res, &dir, &worker);
            (words, Some(node))
        }
    };
    command(&mut s, &words);
    let record = RunRecord {
        format: RUN_RECORD_VERSION,
        run: run.clone(),
        world_size: run.world_size(),
        spec: spec.path.clone(),
        zerobench_version: env!("CARGO_PKG_VERSION").to_string(),
        method: launch.method,
        cluster: cluster.clone(),
        launch: launch.clone(),
        worker_argv: argv(&worker, &dir),
        launch_argv: argv(&words, &dir),
        log_dir: run_dir.join(LOG_DIR),
    };
    Ok(RunFiles { script: s, node_script, hostfile, record })
}

/// The `#SBATCH` block. sbatch stops reading directives at the first command, so this comes
/// first and is all directives. `output` is a Slurm filename pattern whose literal parts went
/// through [`slurm_pattern_literal`].
pub fn directives(s: &mut String, run: &Run, c: &Cluster, job_name: &str, output: &str) -> Result<(), DirectiveError> {
    let mut d = |k: &str, v: &str| {
        let _ = writeln!(s, "#SBATCH --{k}={v}");
    };
    d("job-name", &sbatch_value("job name", job_name)?);
    d("nodes", &run.nodes.to_string());
    d("ntasks-per-node", &run.ranks_per_node.to_string());
    d("cpus-per-task", &c.cpus_per_task.to_string());
    if run.gpus_per_node > 0 {
        d("gpus-per-node", &run.gpus_per_node.to_string());
    }
    if let Some(t) = &c.time {
        d("time", t.as_str());
    }
    // Slurm reads a bare number as MiB; round up so the job gets at least what was asked.
    for (key, m) in [("mem", c.mem), ("mem-per-cpu", c.mem_per_cpu)] {
        if let Some(m) = m {
            d(key, &format!("{}M", m.0.div_ceil(1 << 20)));
        }
    }
    for (k, v) in [("partition", &c.partition), ("account", &c.account), ("qos", &c.qos)] {
        if let Some(v) = v {
            d(k, v.as_str());
        }
    }
    // A run over a hostfile asks Slurm for exactly the hostfile's hosts: pdsh and mpirun reach
    // hosts by name over ssh, and must not start ranks on nodes outside the job's allocation.
    // (A spec gives a hostfile or a nodelist, never both.)
    let pinned = run.hosts.as_ref().map(hostfile_hosts).transpose()?;
    if let Some(nl) = pinned.as_deref().or(c.nodelist.as_deref()) {
        d("nodelist", &sbatch_value("cluster.nodelist", nl)?);
    }
    d("output", &sbatch_value("the output path", output)?);
    Ok(())
}

/// The hosts of a run over a hostfile, as a hostlist expression.
fn hostfile_hosts(res: &Resources) -> Result<String, DirectiveError> {
    let hosts: Vec<&str> = res.hosts.iter().map(|h| h.host.as_str()).collect();
    hostlist::compress(&hosts).map_err(|_| DirectiveError {
        what: "the hostfile's hosts",
        value: hosts.join(","),
        why: "they do not form a Slurm hostlist",
    })
}

/// For runs over a hostfile: inside a Slurm job, stop before `launcher` reaches a host outside the
/// job's allocation (a job submitted by hand without the rendered `--nodelist`, or run with bash
/// inside another allocation). Outside Slurm the hostfile is all there is.
fn allocation_guard(s: &mut String, run: &Run, launcher: &str) {
    let Some(res) = &run.hosts else { return };
    let hosts: Vec<String> = res.hosts.iter().map(|h| sh(&h.host).into_owned()).collect();
    let _ = writeln!(
        s,
        "# {launcher} reaches the hostfile's hosts over ssh: inside a Slurm job, only those of its allocation."
    );
    s.push_str(
        "if [ -n \"${SLURM_JOB_NODELIST:-}\" ]; then
",
    );
    s.push_str(
        "  allocated=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\")
",
    );
    let _ = writeln!(s, "  for host in {}; do", hosts.join(" "));
    s.push_str(
        "    if ! grep -qxF -- \"$host\" <<<\"$allocated\"; then
",
    );
    s.push_str("      echo \"job.sbatch: host $host of the hostfile is outside this job's allocation ($SLURM_JOB_NODELIST); submit the rendered job.sbatch, whose --nodelist asks for the hostfile's hosts\" >&2
");
    s.push_str(
        "      exit 2
    fi
  done
fi
",
    );
}

/// Module loads and exports, from the spec, in order.
fn environment(s: &mut String, c: &Cluster) {
    for m in &c.modules {
        let _ = writeln!(s, "module load {}", sh(m.as_str()));
    }
    for (k, v) in &c.env {
        let _ = writeln!(s, "export {}={}", k.as_str(), sh(v));
    }
}

/// Writes a command with its options wrapped onto continuation lines, for reading.
fn command(s: &mut String, words: &[Word]) {
    let mut line = String::new();
    for (i, w) in words.iter().enumerate() {
        let w = w.shell();
        if i > 0 && w.starts_with("--") && line.len() > 60 {
            let _ = writeln!(s, "{line} \\");
            line = String::from("  ");
        } else if i > 0 {
            line.push(' ');
        }
        line.push_str(&w);
    }
    let _ = writeln!(s, "{line}");
}

fn srun(s: &mut String, spec: &crate::spec::Spec, run: &Run, worker: &[Word]) -> Vec<Word> {
    let mut w = vec![Word::lit("srun")];
    match spec.cluster.allocation {
        None => {}
        Some(Allocation::Job(id)) => {
            let _ =
                writeln!(s, "# A step of the existing allocation {id}: run this script with bash (zerobench local).");
            w.push(Word::lit(format!("--jobid={id}")));
        }
        Some(Allocation::Current) => {
            s.push_str("# A step of the allocation this shell is in (salloc): run this script with bash there.\n");
            s.push_str(": \"${SLURM_JOB_ID:?not inside a Slurm allocation: run this in salloc, or name the job in cluster.allocation}\"\n");
        }
    }
    s.push_str("# srun does not inherit --cpus-per-task from sbatch in Slurm 22.05: pass it again.\n");
    let env_ranks = spec.launch.method == Method::Torchrun;
    let mpi = if env_ranks { "none" } else { spec.launch.mpi.as_str() };
    w.extend([
        Word::lit(format!("--mpi={mpi}")),
        Word::lit(format!("--nodes={}", run.nodes)),
        Word::lit(format!("--ntasks-per-node={}", run.ranks_per_node)),
        Word::lit(format!("--cpus-per-task={}", spec.cluster.cpus_per_task)),
        Word::lit("--kill-on-bad-exit=1"),
    ]);
    if env_ranks {
        s.push_str("# torchrun's convention: each task takes its rank from Slurm and meets the others at the first\n");
        s.push_str("# host of this step (where task 0 runs), on a port derived from the job and run ids.\n");
        w.extend([
            Word::lit("bash"),
            Word::lit("-c"),
            Word::lit(env_rank_wrapper(spec, run)),
            Word::lit("zerobench-rank"),
        ]);
    }
    w.extend(worker.iter().cloned());
    w
}

/// What each task of a torchrun-method step runs before `exec`-ing the worker: the environment
/// convention from Slurm's task variables. The step's node list, not the job's: a step of a larger
/// allocation may run on some of its nodes.
fn env_rank_wrapper(spec: &crate::spec::Spec, run: &Run) -> String {
    let port = match spec.launch.master_port {
        Some(p) => p.to_string(),
        // Runs of one allocation differ by run id, runs of different jobs by job id; the range
        // stays below Linux's ephemeral ports (32768 and up).
        None => format!("$((29500 + (SLURM_JOB_ID + {}) % 3000))", run_hash(run) % 3000),
    };
    format!(
        "{RANK}=$SLURM_PROCID {WORLD_SIZE}=$SLURM_NTASKS {LOCAL_RANK}=$SLURM_LOCALID \
         {MASTER_ADDR}=$(scontrol show hostnames \"$SLURM_STEP_NODELIST\" | head -n 1) {MASTER_PORT}={port} exec \"$@\""
    )
}

/// `mpirun` refuses root unless told; the script decides when it runs.
const ROOT_GUARD: &str = "mpirun_root=()\nif [ \"$(id -u)\" = 0 ]; then mpirun_root=(--allow-run-as-root); fi\n";

fn mpich(s: &mut String, c: &Cluster, run: &Run, worker: &[Word], hostfile: Option<HostfileFormat>) -> Vec<Word> {
    s.push_str("# MPICH/Hydra: -ppn ranks per host");
    s.push_str(if hostfile.is_some() {
        ", hosts from the hostfile.\n"
    } else {
        ", hosts from the Slurm allocation.\n"
    });
    let mut w = vec![
        Word::lit("mpiexec"),
        Word::lit("-n"),
        Word::lit(run.world_size().to_string()),
        Word::lit("-ppn"),
        Word::lit(run.ranks_per_node.to_string()),
    ];
    if let Some(f) = hostfile {
        w.extend([Word::lit("-f"), Word::InRunDir(f.file_name())]);
    }
    let env_names: Vec<&str> = c.env.keys().map(|k| k.as_str()).collect();
    if !env_names.is_empty() {
        w.extend([Word::lit("-genvlist"), Word::lit(env_names.join(","))]);
    }
    w.extend(worker.iter().cloned());
    w
}

/// Where Open MPI's `mpirun` puts the ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Placement {
    /// `ranks_per_node` on each node of the Slurm allocation, or of the hostfile when given.
    PerNode(Option<HostfileFormat>),
    /// All on this host (the local method), even more ranks than it has cores.
    ThisHost,
}

/// Seconds Open MPI's `mpirun` gives a signalled rank before it kills it.
const SIGKILL_AFTER_S: u32 = 10;

fn openmpi(s: &mut String, c: &Cluster, run: &Run, worker: &[Word], placement: Placement) -> Vec<Word> {
    s.push_str(match placement {
        Placement::PerNode(None) => "# Open MPI takes hosts and slots from the Slurm allocation.\n",
        Placement::PerNode(Some(_)) => {
            "# Open MPI takes hosts and slots from the Slurm allocation or, here, from the hostfile.\n"
        }
        Placement::ThisHost => {
            "# All ranks on this host; --oversubscribe lets them outnumber the cores, and --bind-to none\n\
             # leaves each free on all of them (Open MPI would bind each of 2 ranks to one core, where\n\
             # offload's CPU optimizer and libtorch's threads would share it).\n"
        }
    });
    s.push_str(ROOT_GUARD);
    let mut w = vec![Word::lit("mpirun"), Word::RootGuard];
    if placement == Placement::ThisHost {
        w.extend([Word::lit("--oversubscribe"), Word::lit("--bind-to"), Word::lit("none")]);
    }
    // A job cancelled or out of time signals mpirun, which passes SIGTERM to the ranks and kills
    // them 1 s later by default: a rank still writing its last records then (the worker allows
    // itself up to a few seconds, as on a loaded node) loses them. Slurm waits 30 s (KillWait).
    w.extend([Word::lit("--mca"), Word::lit("odls_base_sigkill_timeout"), Word::lit(SIGKILL_AFTER_S.to_string())]);
    w.extend([Word::lit("-np"), Word::lit(run.world_size().to_string())]);
    if let Placement::PerNode(hostfile) = placement {
        // PE=N binds each rank to N cores of its own, as srun --cpus-per-task does (Open MPI's
        // default binds each rank to one core).
        let map = match c.cpus_per_task {
            1 => format!("ppr:{}:node", run.ranks_per_node),
            n => format!("ppr:{}:node:PE={n}", run.ranks_per_node),
        };
        w.extend([Word::lit("--map-by"), Word::lit(map)]);
        if let Some(f) = hostfile {
            w.extend([Word::lit("--hostfile"), Word::InRunDir(f.file_name())]);
        }
    }
    // Open MPI forwards only OMPI_* to remote ranks: name the spec's variables.
    for k in c.env.keys() {
        w.extend([Word::lit("-x"), Word::lit(k.as_str())]);
    }
    w.extend(worker.iter().cloned());
    w
}

/// The rendezvous port of a pdsh run: the spec's, or one derived from the run id so that runs
/// sharing hosts do not collide (29500 is torch's default; the range above it is free by custom).
fn master_port(spec: &crate::spec::Spec, run: &Run) -> u16 {
    spec.launch.master_port.unwrap_or_else(|| 29500 + (run_hash(run) % 1000) as u16)
}

/// FNV-1a of the run id: a stable number per run, for rendezvous ports.
fn run_hash(run: &Run) -> u64 {
    zerobench_schema::fnv::fnv1a(run.id.as_bytes())
}

fn pdsh(
    s: &mut String,
    spec: &crate::spec::Spec,
    run: &Run,
    res: &Resources,
    dir: &str,
    worker: &[Word],
) -> (Vec<Word>, String) {
    let hosts: Vec<&str> = res.hosts.iter().map(|h| h.host.as_str()).collect();
    // Host names were checked when the hostfile was read, so they always compress.
    let wlist = hostlist::compress(&hosts).unwrap_or_else(|_| hosts.join(","));
    let rcmd = match spec.launch.pdsh_rcmd {
        PdshRcmd::Ssh => "ssh",
        PdshRcmd::Exec => "exec",
    };
    // pdsh replaces %n with the host's index in -w, the node rank, and %% with %. With ssh it
    // joins its arguments into one command line for the remote shell, so the path is quoted for
    // that shell too; exec runs the arguments as they are.
    let node_sh = format!("{dir}/node.sh").replace('%', "%%");
    let node_sh = match spec.launch.pdsh_rcmd {
        PdshRcmd::Ssh => sh(&node_sh).into_owned(),
        PdshRcmd::Exec => node_sh,
    };
    if let Some(port) = spec.launch.ssh_port {
        s.push_str("# The hosts' ssh port, after any ssh arguments the environment already gives pdsh.\n");
        let _ =
            writeln!(s, "export PDSH_SSH_ARGS_APPEND=\"${{PDSH_SSH_ARGS_APPEND:+$PDSH_SSH_ARGS_APPEND }}-p {port}\"");
    }
    s.push_str("# DeepSpeed style: pdsh starts node.sh once per host with its node rank (%n); node.sh\n");
    s.push_str("# starts that host's ranks. -S returns the largest remote exit code (pdsh returns 0 without it).\n");
    let w: Vec<Word> = ["pdsh", "-S", "-R", rcmd, "-f", "1024", "-w", &wlist, "bash", &node_sh, "%n"]
        .into_iter()
        .map(Word::lit)
        .collect();
    // Cancelled or out of time, Slurm stops this script and pdsh; over ssh nothing reaches the
    // nodes' node.sh (it runs under sshd, outside the job, and sshd signals no command without a
    // terminal), so each node's is told to stop its ranks, as DeepSpeed's runner does with pkill.
    s.push_str("# Stopped (the job cancelled or out of time), each node's node.sh is told to stop its ranks:\n");
    s.push_str("# over ssh, Slurm's signal does not reach them.\nstop_nodes() {\n  ");
    let stop: Vec<Word> = ["pdsh", "-R", rcmd, "-f", "1024", "-w", &wlist, "bash", &node_sh, "%n", "stop"]
        .into_iter()
        .map(Word::lit)
        .collect();
    command(s, &stop);
    s.push_str(
        "}\ntrap 'stop_nodes; exit 143' TERM; trap 'stop_nodes; exit 129' HUP; trap 'stop_nodes; exit 130' INT\n",
    );

    let mut n = String::with_capacity(2048);
    n.push_str("#!/bin/bash\n");
    let _ =
        writeln!(n, "# One node of zerobench run {}: pdsh starts this on every host with the node rank as $1.", run.id);
    n.push_str("# The remote shell starts with nothing of the submitting shell: cd and environment come from here.\n");
    n.push_str("set -euo pipefail\n\n");
    n.push_str("node_rank=$1\n");
    let _ = writeln!(n, "run_dir={}", sh(dir));
    n.push_str("cd \"$run_dir\"\n");
    n.push_str("pid_file=\"$run_dir/.node$node_rank.pid\"\n");
    n.push_str("if [ \"${2:-}\" = stop ]; then\n");
    n.push_str("  # From job.sbatch, stopped: this node's node.sh, if it still runs, stops its ranks.\n");
    n.push_str("  pid=$(cat \"$pid_file\" 2>/dev/null) && grep -qs node.sh \"/proc/$pid/cmdline\" && kill -TERM \"$pid\" || true\n");
    n.push_str("  exit 0\nfi\n");
    n.push_str("echo $$ > \"$pid_file\"\ntrap 'rm -f \"$pid_file\"' EXIT\n");
    let _ = writeln!(n, "mkdir -p \"$run_dir/{LOG_DIR}\"");
    environment(&mut n, &spec.cluster);
    let _ = writeln!(
        n,
        "export {MASTER_ADDR}={} {MASTER_PORT}={} {WORLD_SIZE}={} LOCAL_SIZE={} NODE_RANK=\"$node_rank\" CROSS_RANK=\"$node_rank\" CROSS_SIZE={}",
        sh(hosts[0]),
        master_port(spec, run),
        run.world_size(),
        run.ranks_per_node,
        run.nodes
    );
    n.push_str("case \"$node_rank\" in\n");
    for (i, h) in res.hosts.iter().enumerate() {
        let slots: Vec<String> = h.slots.iter().map(u32::to_string).collect();
        let _ = writeln!(n, "  {i}) slots=({}) ;;  # {}", slots.join(" "), h.host);
    }
    let _ =
        writeln!(n, "  *) echo \"node.sh: node rank '$node_rank' is not one of 0..{}\" >&2; exit 2 ;;", run.nodes - 1);
    n.push_str("esac\n");
    if run.gpus_per_node > 0 {
        n.push_str("# As DeepSpeed's launch.py: every rank of the node sees the node's slots; LOCAL_RANK picks one.\n");
        n.push_str("CUDA_VISIBLE_DEVICES=$(IFS=,; echo \"${slots[*]}\")\nexport CUDA_VISIBLE_DEVICES\n");
    }
    n.push_str("\npids=()\n");
    n.push_str("# Stopped (by Slurm where it signals this node's processes, or by hand), the node's ranks stop\n");
    n.push_str("# with it, writing their last records, instead of running on without it.\n");
    n.push_str("stop() { kill -TERM \"${pids[@]}\" 2>/dev/null; wait; exit \"$1\"; }\n");
    n.push_str("trap 'stop 143' TERM; trap 'stop 129' HUP; trap 'stop 130' INT\n");
    n.push_str("for local_rank in \"${!slots[@]}\"; do\n");
    let _ = writeln!(n, "  {RANK}=$((node_rank * {} + local_rank)) {LOCAL_RANK}=$local_rank \\", run.ranks_per_node);
    let mut wline = String::new();
    command(&mut wline, worker);
    for line in wline.lines() {
        let _ = write!(n, "    {line}");
        n.push_str(if line.ends_with('\\') { "\n" } else { " &\n" });
    }
    n.push_str("  pids+=($!)\ndone\n");
    n.push_str("# The first rank to fail takes the others down, so none waits forever on a collective;\n");
    n.push_str("# its exit code is the node's.\n");
    n.push_str("rc=0\nfor _ in \"${pids[@]}\"; do\n");
    n.push_str(
        "  wait -n || { code=$?; if [ \"$rc\" = 0 ]; then rc=$code; kill \"${pids[@]}\" 2>/dev/null || true; fi; }\n",
    );
    n.push_str("done\nexit \"$rc\"\n");
    (w, n)
}

/// What may happen to a run folder that already holds a different run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnChange {
    /// Refuse, naming the run and what changed: the folder's logs were produced by the run its
    /// `run.json` records, and rewriting it would make the folder lie.
    #[default]
    Refuse,
    /// Move the old folder aside (to `.replaced/<id>-<unix time>` in the output folder, logs and
    /// all) and render anew.
    MoveAside,
}

/// What rendering did to one run folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendered {
    /// A new folder.
    New,
    /// The folder already holds this very run: nothing was written.
    Unchanged,
    /// The folder held another rendering of this run id but nothing that ran (no logs, no
    /// submission or local record): rewritten.
    Refreshed,
    /// The folder held this run, rendered with other scheduling (`cluster.time`, `account` or
    /// `qos`: a longer time limit after a timeout) or with its paths relative to the folder the
    /// command was given in (before they were made absolute): its scripts and `run.json`
    /// rewritten, its results kept.
    Rescheduled,
    /// The folder held another run's logs; they were moved to `old`.
    Replaced { old: PathBuf },
}

impl Rendered {
    pub fn describe(&self) -> String {
        match self {
            Rendered::New => "new".into(),
            Rendered::Unchanged => "unchanged".into(),
            Rendered::Refreshed => "re-rendered".into(),
            Rendered::Rescheduled => "re-rendered; results kept".into(),
            Rendered::Replaced { old } => format!("replaced; the old run is in {}", old.display()),
        }
    }
}

/// Renders every run of a plan into `out/<run id>/` and returns the run folders. A folder that
/// holds a different run with results is refused ([`render_with`] can move it aside).
pub fn render(plan: &Plan, out: &Path) -> Result<Vec<PathBuf>, Error> {
    Ok(render_with(plan, out, OnChange::Refuse)?.into_iter().map(|(d, _)| d).collect())
}

/// Renders every run of a plan into `out/<run id>/`: each folder with what was done to it. Every
/// folder is checked before any is written, so a refusal leaves the whole output as it was.
pub fn render_with(plan: &Plan, out: &Path, on_change: OnChange) -> Result<Vec<(PathBuf, Rendered)>, Error> {
    check(plan, out, on_change)?.write()
}

/// A plan rendered in memory and compared with what its folders hold, nothing written yet
/// ([`check`]).
pub struct Checked {
    runs: Vec<(PathBuf, RunFiles, Found)>,
}

/// What a run folder holds against the run about to be rendered there ([`compare`]).
enum Found {
    /// Nothing (`None`), or this run: unchanged, a rendering that never ran, or this run that ran
    /// under other scheduling; what writing makes of it.
    Same(Option<Rendered>),
    /// Another run that ran: what differs, and its record where it reads as one.
    Other { what: String, record: Option<Box<RunRecord>> },
}

/// Renders every run of a plan in memory and compares each with its folder `out/<run id>/`,
/// writing nothing but `out` itself: with [`OnChange::Refuse`], a folder holding another run that
/// ran is an error.
pub fn check(plan: &Plan, out: &Path, on_change: OnChange) -> Result<Checked, Error> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let out = std::fs::canonicalize(out).map_err(|e| Error::io(out, e))?;
    let mut runs = Vec::with_capacity(plan.runs.len());
    for run in &plan.runs {
        let dir = out.join(&run.id);
        let files = render_run(plan, run, &dir)?;
        let found = compare(&dir, &files.record)?;
        if let (Found::Other { what, .. }, OnChange::Refuse) = (&found, on_change) {
            return Err(Error::RunChanged { run: run.id.clone(), dir: dir.clone(), what: what.clone() });
        }
        runs.push((dir, files, found));
    }
    Ok(Checked { runs })
}

impl Checked {
    /// The folders writing would move aside, each holding another run that ran, with that run's
    /// record where its `run.json` reads as one ([`read_record`]'s rules).
    pub fn to_replace(&self) -> impl Iterator<Item = (&Path, Option<&RunRecord>)> {
        self.runs.iter().filter_map(|(dir, _, found)| match found {
            Found::Other { record, .. } => Some((dir.as_path(), record.as_deref())),
            Found::Same(_) => None,
        })
    }

    /// Writes every folder that needs it, moving aside those [`Self::to_replace`] names.
    pub fn write(self) -> Result<Vec<(PathBuf, Rendered)>, Error> {
        let mut done = Vec::with_capacity(self.runs.len());
        for (dir, files, found) in self.runs {
            let rendered = match found {
                Found::Same(Some(Rendered::Unchanged)) => Rendered::Unchanged,
                Found::Same(Some(r)) => {
                    write_run(&dir, &files)?;
                    r
                }
                Found::Same(None) => {
                    write_run(&dir, &files)?;
                    Rendered::New
                }
                Found::Other { .. } => {
                    let old = aside(&dir)?;
                    write_run(&dir, &files)?;
                    Rendered::Replaced { old }
                }
            };
            done.push((dir, rendered));
        }
        Ok(done)
    }
}

/// The `cluster` keys of a run that only schedule it: a folder whose run differs in these alone
/// holds the same run (raising the time limit after a timeout, then `--retry-failed`, must not
/// need `--overwrite`, which would move finished results aside).
const SCHEDULING: [&str; 3] = ["time", "account", "qos"];

/// What an existing folder holds against the run about to be rendered there. Its `run.json` is
/// read once: as JSON for the comparison, and as a record for the run it names.
fn compare(dir: &Path, new: &RunRecord) -> Result<Found, Error> {
    match std::fs::symlink_metadata(dir) {
        Err(_) => return Ok(Found::Same(None)),
        // A run folder linked elsewhere would put the run's files there: refused, not followed.
        Ok(m) if m.file_type().is_symlink() => {
            return Err(Error::Usage(format!(
                "{} is a symbolic link; a run folder is written only where it is, not through a link",
                dir.display()
            )))
        }
        Ok(_) => {}
    }
    let path = dir.join("run.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&path, e)),
    };
    let old = text.as_deref().and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok());
    let new = serde_json::to_value(new).unwrap_or_default();
    // Where the spec lives and which build rendered it do not change what runs.
    let what_runs = |v: &serde_json::Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("spec");
            o.remove("zerobench_version");
        }
        v
    };
    // Nor does how the scheduler treats it, or where a relative path was given from.
    let what_computes = |v: &serde_json::Value| {
        let mut v = what_runs(v);
        absolute_paths(&mut v);
        if let Some(c) = v.get_mut("cluster").and_then(serde_json::Value::as_object_mut) {
            for key in SCHEDULING {
                c.remove(key);
            }
        }
        v
    };
    let differs = match &old {
        Some(old) if what_runs(old) == what_runs(&new) => return Ok(Found::Same(Some(Rendered::Unchanged))),
        Some(old) if what_computes(old) == what_computes(&new) => {
            let r = if has_results(dir) { Rendered::Rescheduled } else { Rendered::Refreshed };
            return Ok(Found::Same(Some(r)));
        }
        Some(old) => {
            let (old, new) = (what_runs(old), what_runs(&new));
            let (path, o, n) = first_difference(&old, &new, String::new());
            let show = |v: Option<&serde_json::Value>| {
                let t = v.map_or_else(|| "nothing".to_string(), |v| v.to_string());
                if t.chars().count() > 80 {
                    format!("{}...", t.chars().take(77).collect::<String>())
                } else {
                    t
                }
            };
            format!("its run.json has {path} = {}, the spec now gives {}", show(o), show(n))
        }
        None => "it has no readable run.json".to_string(),
    };
    Ok(if has_results(dir) {
        Found::Other { what: differs, record: text.and_then(|t| parse_record(&path, &t).ok()).map(Box::new) }
    } else {
        Found::Same(Some(Rendered::Refreshed))
    })
}

/// Makes a `run.json`'s relative paths absolute, as a spec's are now ([`Spec`]'s anchoring):
/// folders rendered before kept `worker.data` and `cluster.hostfile` relative to the folder the
/// command was given in, and must still read as the same run when given from there again.
fn absolute_paths(run: &mut serde_json::Value) {
    for pointer in ["/config/data", "/cluster/hostfile"] {
        if let Some(v) = run.pointer_mut(pointer) {
            if let Some(p) = v.as_str().map(Path::new).filter(|p| p.is_relative()) {
                if let Ok(abs) = std::path::absolute(p) {
                    *v = serde_json::Value::String(abs.to_string_lossy().into_owned());
                }
            }
        }
    }
}

/// The first place two JSON values differ: its dotted path and both sides there.
fn first_difference<'a>(
    old: &'a serde_json::Value,
    new: &'a serde_json::Value,
    path: String,
) -> (String, Option<&'a serde_json::Value>, Option<&'a serde_json::Value>) {
    if let (Some(o), Some(n)) = (old.as_object(), new.as_object()) {
        let keys: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
        for k in keys {
            let at = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
            match (o.get(k), n.get(k)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => return first_difference(a, b, at),
                (a, b) => return (at, a, b),
            }
        }
    }
    (path, Some(old), Some(new))
}

/// Whether anything in a run folder came from running it: rank logs, a submission or a local
/// record, a job's output.
pub fn has_results(dir: &Path) -> bool {
    let logs = std::fs::read_dir(dir.join(LOG_DIR)).is_ok_and(|mut d| d.next().is_some());
    let records = ["slurm.json", "local.json", "local.out"].iter().any(|f| dir.join(f).exists());
    let outputs =
        std::fs::read_dir(dir).is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".out")));
    logs || records || outputs
}

/// Where replaced run folders are kept, in the output folder: a hidden folder, so that `status`
/// and `ingest` of the output read the current runs only.
pub const REPLACED_DIR: &str = ".replaced";

/// Moves a run folder to `<out>/.replaced/<id>-<unix time>[-n]`; returns where it went.
fn aside(dir: &Path) -> Result<PathBuf, Error> {
    let name = dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let keep = dir.parent().unwrap_or(Path::new(".")).join(REPLACED_DIR);
    move_aside(dir, &keep, &name)
}

/// Moves `from` into the folder `keep` (created if needed) as `<name>-<unix time>[-n]`, never
/// over anything; returns the new path.
pub fn move_aside(from: &Path, keep: &Path, name: &str) -> Result<PathBuf, Error> {
    // A link there would carry the results out of the output folder, to wherever it points.
    if std::fs::symlink_metadata(keep).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(Error::Usage(format!(
            "{} is a symbolic link; runs are moved aside only into a folder of the output folder itself",
            keep.display()
        )));
    }
    std::fs::create_dir_all(keep).map_err(|e| Error::io(keep, e))?;
    let stamp = crate::time::unix_now();
    for n in 0..1000 {
        let suffix = if n == 0 { String::new() } else { format!("-{n}") };
        let to = keep.join(format!("{name}-{stamp}{suffix}"));
        if std::fs::symlink_metadata(&to).is_ok() {
            continue;
        }
        std::fs::rename(from, &to).map_err(|e| Error::io(from, e))?;
        return Ok(to);
    }
    Err(Error::io(from, std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no free name to move it aside")))
}

/// A job Slurm requeued (after a node failure, a preemption, `scontrol requeue`) runs its script
/// again with `SLURM_RESTART_COUNT` set: the worker would find the first attempt's logs and refuse
/// to write over them (exit 5), so every requeued job failed. The script sets them aside first,
/// into `.attempts/restart<N>-<time>/`, as `--retry-failed` does, and the run starts fresh.
fn restart_guard(s: &mut String) {
    let attempts = ATTEMPTS_DIR;
    let _ = writeln!(
        s,
        "# A requeued job (SLURM_RESTART_COUNT > 0) sets the earlier attempt's logs aside.\n\
         if [ \"${{SLURM_RESTART_COUNT:-0}}\" -gt 0 ] && [ -d \"$run_dir/{LOG_DIR}\" ]; then\n\
         \x20 attempt=\"$run_dir/{attempts}/restart${{SLURM_RESTART_COUNT}}-$(date +%s)\"\n\
         \x20 mkdir -p \"$attempt\" && mv \"$run_dir/{LOG_DIR}\" \"$attempt/\"\n\
         fi"
    );
}

/// Writes one run folder's rendered files, `run.json` last. A folder's earlier `run.json` goes
/// first: a rewrite cut short (a full disk) would otherwise leave it describing the run before
/// beside the new script, and the next render, trusting it, would call the folder unchanged.
/// Without it the folder reads as a rendering that never finished ([`run_dirs`] names it).
pub fn write_run(dir: &Path, files: &RunFiles) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let record = dir.join("run.json");
    match std::fs::remove_file(&record) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(&record, e)),
        _ => {}
    }
    let write = |name: &str, text: &str| zerobench_files::replace(&dir.join(name), text.as_bytes());
    write("job.sbatch", &files.script)?;
    if let Some(node) = &files.node_script {
        write("node.sh", node)?;
    }
    if let Some((format, text)) = &files.hostfile {
        write(&format.file_name(), text)?;
    }
    Ok(write("run.json", &files.run_json())?)
}

/// Reads a run folder's `run.json`; one of another format is refused with both versions named.
pub fn read_record(dir: &Path) -> Result<RunRecord, Error> {
    let p = dir.join("run.json");
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
    parse_record(&p, &text)
}

/// A `run.json`'s text (read from `p`) as a record, as [`read_record`] takes it.
fn parse_record(p: &Path, text: &str) -> Result<RunRecord, Error> {
    /// The version alone, read first: a record of another format would otherwise fail on the
    /// first field that differs, with a message that does not say why.
    #[derive(Deserialize)]
    struct Format {
        format: u32,
    }
    let json_error = |e: serde_json::Error| Error::Json {
        path: p.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    };
    let Format { format } = serde_json::from_str(text).map_err(json_error)?;
    if format != RUN_RECORD_VERSION {
        return Err(Error::RecordFormat { path: p.to_path_buf(), found: format, expected: RUN_RECORD_VERSION });
    }
    serde_json::from_str(text).map_err(json_error)
}

/// The run folders under `out` (those with a `run.json`), sorted by id. A folder holding a
/// rendered script but no `run.json` is a rendering cut short (a full disk): an error naming it,
/// not a run passed over in silence.
pub fn run_dirs(out: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| Error::io(out, e))? {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let p = entry.path();
        if p.join("run.json").is_file() {
            dirs.push(p);
        } else if p.join("job.sbatch").is_file() {
            return Err(Error::Unfinished { dir: p });
        }
    }
    dirs.sort();
    Ok(dirs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Spec;

    fn rendered(out: &Path) -> (Plan, PathBuf) {
        let spec = Spec::parse(
            "cluster: {gpus_per_node: 2, gpu_memory: 16GiB}\nsweep:\n  models: tiny\n  stages: 3\n  offload: optimizer+params\n",
            Path::new("s.yaml"),
        )
        .unwrap();
        let plan = Plan::build(spec).unwrap();
        let dir = render(&plan, out).unwrap().remove(0);
        (plan, dir)
    }

    #[test]
    fn run_json_reads_back_as_written() {
        let out = tempfile::tempdir().unwrap();
        let (plan, dir) = rendered(out.path());
        let rec = read_record(&dir).unwrap();
        let run = &plan.runs[0];
        // The planned run comes back whole, and its fields sit at the top level of the JSON.
        assert_eq!(serde_json::to_value(&rec.run).unwrap(), serde_json::to_value(run).unwrap());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
        assert_eq!(json["id"], run.id.as_str());
        assert_eq!(json["host_state_bytes"], run.host_state_bytes);
        assert_eq!(json["world_size"], 2);
        assert!(json.get("run").is_none(), "{json}");
        // Every other reader's view of it (schema's `PlannedRun`) is the same run.
        let head = zerobench_schema::job::PlannedRun::from_json(&json).expect("a run.json of this format");
        assert_eq!((head.id.as_str(), &head.config), (run.id.as_str(), &run.config));
        assert_eq!((head.nodes, head.world_size), (run.nodes, run.world_size()));
        // The worker's argv is the tail of the launch command, its log folder spelled out.
        let log_dir = dir.join(LOG_DIR).to_string_lossy().into_owned();
        assert!(rec.launch_argv.ends_with(&rec.worker_argv), "{:?}", rec.launch_argv);
        assert!(rec.worker_argv.windows(2).any(|w| w == ["--log-dir", log_dir.as_str()]), "{:?}", rec.worker_argv);
        assert_eq!(rec.log_dir, dir.join(LOG_DIR));
    }

    #[test]
    fn a_record_of_another_format_is_refused_with_both_versions() {
        let out = tempfile::tempdir().unwrap();
        let (_, dir) = rendered(out.path());
        let p = dir.join("run.json");
        let text = std::fs::read_to_string(&p).unwrap();
        let old = text.replacen(&format!("\"format\": {RUN_RECORD_VERSION},"), "\"format\": 99,", 1);
        assert_ne!(old, text);
        std::fs::write(&p, old).unwrap();
        let e = read_record(&dir).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: format 99, but this zerobench reads format {RUN_RECORD_VERSION}: render the spec again",
                p.display()
            )
        );
    }

    /// A folder that holds this very run is left alone; another rendering that never ran is
    /// rewritten; one with results is refused, and moved aside when asked.
    #[test]
    fn existing_folders_by_what_they_hold() {
        let out = tempfile::tempdir().unwrap();
        let parse = |yaml: &str| Plan::build(Spec::parse(yaml, Path::new("s.yaml")).unwrap()).unwrap();
        let a = parse("sweep: {models: tiny, stages: 1}\nworker: {steps: 3}\n");
        let b = parse("sweep: {models: tiny, stages: 1}\nworker: {steps: 4}\n");
        assert_eq!(render_with(&a, out.path(), OnChange::Refuse).unwrap()[0].1, Rendered::New);
        assert_eq!(render_with(&a, out.path(), OnChange::Refuse).unwrap()[0].1, Rendered::Unchanged);
        let (dir, what) = render_with(&b, out.path(), OnChange::Refuse).unwrap().remove(0);
        assert_eq!(what, Rendered::Refreshed, "nothing ran there");
        std::fs::write(dir.join("local.json"), "{}").unwrap();
        let e = render_with(&a, out.path(), OnChange::Refuse).unwrap_err().to_string();
        assert!(e.contains("config.steps = 4, the spec now gives 3"), "{e}");
        assert!(read_record(&dir).unwrap().worker_argv.windows(2).any(|w| w == ["--steps", "4"]), "refused, unchanged");
        // The folder to move aside comes with the record of the run it holds (what `--overwrite`
        // asks the run's state of); one of another format comes with none.
        let checked = check(&a, out.path(), OnChange::MoveAside).unwrap();
        let replaced: Vec<_> =
            checked.to_replace().map(|(d, r)| (d.to_path_buf(), r.map(|r| r.run.config.steps))).collect();
        assert_eq!(replaced, [(dir.clone(), Some(4))]);
        assert_eq!(check(&b, out.path(), OnChange::MoveAside).unwrap().to_replace().count(), 0, "the same run");
        let text = std::fs::read_to_string(dir.join("run.json")).unwrap();
        let format = format!("\"format\": {RUN_RECORD_VERSION}");
        assert!(text.contains(&format), "{text}");
        std::fs::write(dir.join("run.json"), text.replace(&format, "\"format\": 99")).unwrap();
        let checked = check(&a, out.path(), OnChange::MoveAside).unwrap();
        assert_eq!(
            checked.to_replace().map(|(d, r)| (d.to_path_buf(), r.is_some())).collect::<Vec<_>>(),
            [(dir.clone(), false)]
        );
        let (_, what) = render_with(&a, out.path(), OnChange::MoveAside).unwrap().remove(0);
        let Rendered::Replaced { old } = what else { panic!("{what:?}") };
        assert!(old.starts_with(out.path().canonicalize().unwrap().join(REPLACED_DIR)), "{}", old.display());
        assert!(old.join("local.json").is_file());
    }

    /// A run folder that is a symbolic link is refused, not written through.
    #[test]
    fn a_linked_run_folder_is_refused() {
        let out = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let plan =
            Plan::build(Spec::parse("sweep: {models: tiny, stages: 1}\n", Path::new("s.yaml")).unwrap()).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), out.path().join(&plan.runs[0].id)).unwrap();
        let e = render(&plan, out.path()).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    fn job_of(yaml: &str) -> String {
        let out = tempfile::tempdir().unwrap();
        let plan = Plan::build(Spec::parse(yaml, Path::new("s.yaml")).unwrap()).unwrap();
        let dir = render(&plan, out.path()).unwrap().remove(0);
        std::fs::read_to_string(dir.join("job.sbatch")).unwrap()
    }

    /// Open MPI binds each of 2 ranks to one core by default; offload's CPU AdamW then ran on one
    /// core (t5-3b, 2 GPUs: 2.3 s steps against a 0.44 s bound).
    #[test]
    fn host_memory_is_asked_for_in_mib_rounded_up() {
        let job = job_of("cluster: {mem: 42GiB}\nsweep: {models: tiny}\n");
        assert!(job.contains("#SBATCH --mem=43008M\n"), "{job}");
        let odd = job_of("cluster: {mem: 1000001}\nsweep: {models: tiny}\n");
        assert!(odd.contains("#SBATCH --mem=1M\n"), "{odd}");
        assert!(!job_of("sweep: {models: tiny}\n").contains("--mem"));
        let per_cpu = job_of("cluster: {mem_per_cpu: 4GiB}\nsweep: {models: tiny}\n");
        assert!(per_cpu.contains("#SBATCH --mem-per-cpu=4096M\n") && !per_cpu.contains("--mem="), "{per_cpu}");
    }

    /// The spec of a 2-node run over one of the repository's hostfiles.
    fn hostfile_spec(method: &str, mpi_impl: &str, hostfile: &str, format: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hostfiles").join(hostfile);
        format!(
            "cluster:\n  hostfile: {}\n  hostfile_format: {format}\n  modules: [gcc/12, 'cuda/12 x']\n  env: {{OMP_NUM_THREADS: '2'}}\nlaunch:\n  method: {method}\n  mpi_impl: {mpi_impl}\nsweep:\n  models: tiny\n  stages: 1\n  nodes: 2\n  ranks_per_node: 1\n",
            path.display()
        )
    }

    /// Each launcher gets the hostfile in its own format, and the job asks Slurm for exactly the
    /// hostfile's hosts and refuses to reach any outside its allocation.
    #[test]
    fn hostfile_runs_get_their_launchers_format_the_nodelist_and_the_guard() {
        for (method, imp, file) in [
            ("pdsh", "openmpi", "hostfile.deepspeed"),
            ("mpirun", "openmpi", "hostfile.openmpi"),
            ("mpirun", "mpich", "hostfile.mpich"),
        ] {
            let out = tempfile::tempdir().unwrap();
            let yaml = hostfile_spec(method, imp, "openmpi.txt", "openmpi");
            let plan = Plan::build(Spec::parse(&yaml, Path::new("s.yaml")).unwrap()).unwrap();
            let dir = render(&plan, out.path()).unwrap().remove(0);
            let names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("hostfile"))
                .collect();
            assert_eq!(names, [file], "{method} {imp}");
            let job = std::fs::read_to_string(dir.join("job.sbatch")).unwrap();
            assert!(job.contains("#SBATCH --nodelist=\"worker-[0-1]\"\n"), "{job}");
            assert!(job.contains("allocated=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\")"), "{job}");
            assert!(job.contains("  for host in worker-0 worker-1; do\n"), "{job}");
        }
        let job = job_of("sweep: {models: tiny}\n");
        assert!(!job.contains("--nodelist") && !job.contains("scontrol"), "{job}");
    }

    #[test]
    fn modules_are_loaded_and_variables_exported_in_order() {
        let job = job_of(&hostfile_spec("mpirun", "openmpi", "openmpi.txt", "openmpi"));
        assert!(job.contains("module load gcc/12\nmodule load 'cuda/12 x'\nexport OMP_NUM_THREADS=2\n"), "{job}");
    }

    #[test]
    fn gpus_per_node_is_asked_for_only_when_there_are_gpus() {
        assert!(job_of("cluster: {gpus_per_node: 2}\nsweep: {models: tiny}\n").contains("#SBATCH --gpus-per-node=2\n"));
        assert!(!job_of("sweep: {models: tiny}\n").contains("--gpus-per-node"));
    }

    /// Options wrap onto continuation lines once a line passes 60 characters; the first word and
    /// words that are not options never start one.
    #[test]
    fn long_commands_wrap_before_options() {
        let words = |ws: &[&str]| ws.iter().map(|w| Word::lit(*w)).collect::<Vec<_>>();
        let mut s = String::new();
        command(&mut s, &words(&["--prog", "--a", "b"]));
        assert_eq!(s, "--prog --a b\n");
        // 60 characters exactly do not wrap; one more does, and only before an option.
        let w59 = "x".repeat(59);
        let mut s = String::new();
        command(&mut s, &words(&["p", &w59[..58], "--c", "d"]));
        assert_eq!(s, format!("p {} --c d\n", &w59[..58]));
        let mut s = String::new();
        command(&mut s, &words(&["p", &w59, "value", "--c", "d"]));
        assert_eq!(s, format!("p {w59} value \\\n  --c d\n"));
    }

    /// torchrun's method is an srun step without MPI whose tasks take their ranks from Slurm's
    /// variables; srun's own method keeps the spec's MPI plugin and runs the worker directly.
    #[test]
    fn srun_steps_take_ranks_from_slurm_or_from_mpi() {
        let torchrun = job_of("launch: {method: torchrun}\nsweep: {models: tiny, nodes: 2, ranks_per_node: 2}\n");
        assert!(torchrun.contains("srun --mpi=none --nodes=2 --ntasks-per-node=2"), "{torchrun}");
        assert!(
            // 552: FNV-1a of the run id tiny_z0_offnone_mb1_2x2, modulo 3000 (computed apart).
            torchrun.contains("bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID MASTER_ADDR=$(scontrol show hostnames \"$SLURM_STEP_NODELIST\" | head -n 1) MASTER_PORT=$((29500 + (SLURM_JOB_ID + 552) % 3000)) exec"),
            "{torchrun}"
        );
        assert!(torchrun.contains(" exec \"$@\"' zerobench-rank zerobench-worker"), "{torchrun}");
        let pinned = job_of("launch: {method: torchrun, master_port: 29600}\nsweep: {models: tiny, nodes: 2}\n");
        assert!(pinned.contains("MASTER_PORT=29600 exec"), "{pinned}");
        let srun = job_of("launch: {method: srun}\nsweep: {models: tiny, nodes: 2, ranks_per_node: 2}\n");
        assert!(srun.contains("srun --mpi=pmix --nodes=2"), "{srun}");
        assert!(!srun.contains("RANK="), "{srun}");
    }

    /// MPICH's Hydra gets the hostfile with -f and the spec's variables with -genvlist; without
    /// variables there is no -genvlist.
    #[test]
    fn mpich_gets_its_hostfile_and_the_variables_to_pass() {
        let job = job_of(&hostfile_spec("mpirun", "mpich", "openmpi.txt", "openmpi"));
        assert!(
            job.contains(
                "mpiexec -n 2 -ppn 1 -f \"$run_dir/hostfile.mpich\" -genvlist OMP_NUM_THREADS zerobench-worker"
            ),
            "{job}"
        );
        let bare =
            job_of("launch: {method: mpirun, mpi_impl: mpich}\nsweep: {models: tiny, nodes: 2, ranks_per_node: 2}\n");
        assert!(bare.contains("mpiexec -n 4 -ppn 2 zerobench-worker"), "{bare}");
    }

    /// pdsh starts node.sh on every host of the hostfile; node.sh exports the rendezvous (the
    /// port derived from the run id) and starts the host's ranks, each GPU host's slots visible.
    #[test]
    fn pdsh_starts_node_sh_on_each_host_with_the_rendezvous() {
        for gpus in [0, 1] {
            let out = tempfile::tempdir().unwrap();
            let yaml = hostfile_spec("pdsh", "openmpi", "deepspeed.txt", "deepspeed")
                .replace("cluster:\n", &format!("cluster:\n  gpus_per_node: {gpus}\n"));
            let plan = Plan::build(Spec::parse(&yaml, Path::new("s.yaml")).unwrap()).unwrap();
            let dir = render(&plan, out.path()).unwrap().remove(0);
            assert_eq!(plan.runs[0].id, "tiny_z1_offnone_mb1_2x1");
            let job = std::fs::read_to_string(dir.join("job.sbatch")).unwrap();
            let node_sh = dir.join("node.sh").to_string_lossy().into_owned();
            assert!(
                job.contains(&format!("pdsh -S -R ssh -f 1024 -w 'worker-[0-1]' bash {} %n", sh(&sh(&node_sh)))),
                "{job}"
            );
            let node = std::fs::read_to_string(dir.join("node.sh")).unwrap();
            // 30146 = 29500 + FNV-1a of the run id modulo 1000 (computed apart).
            assert!(
                node.contains(
                    "export MASTER_ADDR=worker-0 MASTER_PORT=30146 WORLD_SIZE=2 LOCAL_SIZE=1 NODE_RANK=\"$node_rank\""
                ),
                "{node}"
            );
            assert!(node.contains("  0) slots=(0) ;;  # worker-0\n  1) slots=(0) ;;  # worker-1\n"), "{node}");
            assert_eq!(node.contains("export CUDA_VISIBLE_DEVICES"), gpus > 0, "{node}");
        }
    }

    #[test]
    fn what_rendering_did_is_described() {
        assert_eq!(Rendered::New.describe(), "new");
        assert_eq!(Rendered::Unchanged.describe(), "unchanged");
        assert_eq!(Rendered::Refreshed.describe(), "re-rendered");
        assert_eq!(Rendered::Rescheduled.describe(), "re-rendered; results kept");
        assert_eq!(
            Rendered::Replaced { old: "/o/.replaced/x-1".into() }.describe(),
            "replaced; the old run is in /o/.replaced/x-1"
        );
    }

    /// A folder without run.json is rendered again when nothing ran there and refused when
    /// something did; a run.json that cannot be read is an error naming it.
    #[test]
    fn a_folder_without_a_readable_run_json() {
        let out = tempfile::tempdir().unwrap();
        let plan =
            Plan::build(Spec::parse("sweep: {models: tiny, stages: 1}\n", Path::new("s.yaml")).unwrap()).unwrap();
        let dir = out.path().join(&plan.runs[0].id);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(render_with(&plan, out.path(), OnChange::Refuse).unwrap()[0].1, Rendered::Refreshed);
        std::fs::remove_file(dir.join("run.json")).unwrap();
        std::fs::write(dir.join("local.json"), "{}").unwrap();
        let e = render_with(&plan, out.path(), OnChange::Refuse).unwrap_err().to_string();
        assert!(e.contains("it has no readable run.json"), "{e}");
        // Unreadable (a folder), beside results: an error reading it, not "no readable run.json".
        std::fs::create_dir(dir.join("run.json")).unwrap();
        let e = render_with(&plan, out.path(), OnChange::Refuse).unwrap_err().to_string();
        assert!(e.contains("run.json") && !e.contains("no readable"), "{e}");
    }

    /// A run that ran, rendered again with another time limit, account or qos only, is the same
    /// run: its scripts take the new limit and its results stay (a timeout, the limit raised,
    /// then `--retry-failed` was refused as "a different run"); anything else that differs is
    /// still refused.
    #[test]
    fn a_run_rescheduled_keeps_its_results_and_takes_the_new_limit() {
        let out = tempfile::tempdir().unwrap();
        let plan_of = |cluster: &str| {
            let text = format!("cluster: {{{cluster}}}\nsweep: {{models: tiny, stages: 1}}\n");
            Plan::build(Spec::parse(&text, Path::new("s.yaml")).unwrap()).unwrap()
        };
        let first = plan_of("time: \"0:02\"");
        let dir = render(&first, out.path()).unwrap().remove(0);
        std::fs::write(dir.join("local.json"), "{}").unwrap();
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        std::fs::write(dir.join("logs/rank0.jsonl"), "{}\n").unwrap();
        let longer = plan_of("time: \"00:30:00\", account: proj, qos: long");
        let done = render_with(&longer, out.path(), OnChange::Refuse).unwrap();
        assert_eq!(done[0].1, Rendered::Rescheduled);
        let script = std::fs::read_to_string(dir.join("job.sbatch")).unwrap();
        assert!(script.contains("--time=00:30:00") && script.contains("--account=proj"), "{script}");
        assert_eq!(std::fs::read_to_string(dir.join("logs/rank0.jsonl")).unwrap(), "{}\n");
        assert!(dir.join("local.json").exists());
        // Again: the folder now holds this very run.
        assert_eq!(render_with(&longer, out.path(), OnChange::Refuse).unwrap()[0].1, Rendered::Unchanged);
        // What the run computes on is another run.
        let e = render_with(
            &plan_of("time: \"00:30:00\", account: proj, qos: long, partition: other"),
            out.path(),
            OnChange::Refuse,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cluster.partition"), "{e}");
        // A folder where nothing ran is re-rendered, with no results to keep.
        let fresh = tempfile::tempdir().unwrap();
        render(&first, fresh.path()).unwrap();
        assert_eq!(render_with(&longer, fresh.path(), OnChange::Refuse).unwrap()[0].1, Rendered::Refreshed);
    }

    /// A folder rendered before spec paths were made absolute holds `worker.data` and
    /// `cluster.hostfile` relative to where the command was given: given from there again, the
    /// same run (it read as "a different run", and only `--overwrite` went on).
    #[test]
    fn a_run_json_with_the_old_relative_paths_is_the_same_run() {
        let d = tempfile::tempdir_in(".").unwrap();
        let name = d.path().file_name().unwrap().to_str().unwrap().to_string();
        std::fs::write(d.path().join("text.txt"), "some text").unwrap();
        let spec = Path::new(&name).join("s.yaml");
        let plan =
            Plan::build(Spec::parse("worker: {data: text.txt}\nsweep: {models: tiny}\n", &spec).unwrap()).unwrap();
        let out = d.path().join("out");
        let dir = render(&plan, &out).unwrap().remove(0);
        std::fs::write(dir.join("local.json"), "{}").unwrap();
        let mut old: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
        let relative = format!("{name}/text.txt");
        *old.pointer_mut("/config/data").unwrap() = relative.clone().into();
        std::fs::write(dir.join("run.json"), old.to_string()).unwrap();
        assert_eq!(render_with(&plan, &out, OnChange::Refuse).unwrap()[0].1, Rendered::Rescheduled);
        let data = |f: &str| serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(dir.join(f)).unwrap());
        let now = data("run.json").unwrap()["config"]["data"].as_str().unwrap().to_string();
        assert!(Path::new(&now).is_absolute() && now.ends_with(&relative), "{now}");
        assert!(
            std::fs::read_to_string(dir.join("job.sbatch")).unwrap().contains(&now),
            "the script keeps the old path"
        );
        assert!(dir.join("local.json").exists());
        // Another relative path is another run.
        *old.pointer_mut("/config/data").unwrap() = format!("{name}/other.txt").into();
        std::fs::write(dir.join("run.json"), old.to_string()).unwrap();
        assert!(render_with(&plan, &out, OnChange::Refuse).unwrap_err().to_string().contains("config.data"));
    }

    /// What changed is shown whole up to 80 characters, and cut to 77 and "..." beyond.
    #[test]
    fn a_changed_value_is_shown_whole_up_to_80_characters() {
        let out = tempfile::tempdir().unwrap();
        let plan = |v: &str| {
            let yaml = format!("cluster: {{env: {{V: '{v}'}}}}\nsweep: {{models: tiny, stages: 1}}\n");
            Plan::build(Spec::parse(&yaml, Path::new("s.yaml")).unwrap()).unwrap()
        };
        let (a78, b78, b79) = ("a".repeat(78), "b".repeat(78), "b".repeat(79));
        let dir = render(&plan(&a78), out.path()).unwrap().remove(0);
        std::fs::write(dir.join("local.json"), "{}").unwrap();
        let e = render(&plan(&b78), out.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("cluster.env.V = \"{a78}\", the spec now gives \"{b78}\"")), "{e}");
        let e = render(&plan(&b79), out.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("the spec now gives \"{}...", "b".repeat(76))), "{e}");
        assert!(!e.contains(&b79), "{e}");
    }

    /// Moving aside never overwrites: the same name in the same second gets `-1`, `-2`, ...
    #[test]
    fn moving_aside_never_overwrites() {
        // Three moves within one second (tried again if they straddle one).
        for _ in 0..5 {
            let tmp = tempfile::tempdir().unwrap();
            let keep = tmp.path().join("keep");
            let mut went = Vec::new();
            for i in 0..3 {
                let from = tmp.path().join(format!("d{i}"));
                std::fs::create_dir(&from).unwrap();
                std::fs::write(from.join("f"), i.to_string()).unwrap();
                went.push(move_aside(&from, &keep, "run").unwrap());
            }
            for (i, p) in went.iter().enumerate() {
                assert_eq!(std::fs::read_to_string(p.join("f")).unwrap(), i.to_string());
            }
            let names: Vec<String> =
                went.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
            let stamp = names[0]["run-".len()..].split('-').next().unwrap().to_string();
            if names.iter().all(|n| n.starts_with(&format!("run-{stamp}"))) {
                assert_eq!(names, [format!("run-{stamp}"), format!("run-{stamp}-1"), format!("run-{stamp}-2")]);
                return;
            }
        }
        panic!("five tries each straddled a second");
    }

    /// The run folders of an output folder are those holding a run.json, sorted.
    #[test]
    fn run_dirs_are_the_folders_with_a_run_json() {
        let out = tempfile::tempdir().unwrap();
        for d in ["b", "a", "c"] {
            std::fs::create_dir(out.path().join(d)).unwrap();
        }
        std::fs::write(out.path().join("b/run.json"), "{}").unwrap();
        std::fs::write(out.path().join("a/run.json"), "{}").unwrap();
        std::fs::write(out.path().join("note.txt"), "").unwrap();
        assert_eq!(run_dirs(out.path()).unwrap(), [out.path().join("a"), out.path().join("b")]);
    }

    /// A link planted where replaced runs are kept (`.replaced`, `.attempts`) is refused, not
    /// followed: the results moved aside would have left the output folder.
    #[test]
    fn runs_are_never_moved_aside_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let run = tmp.path().join("run");
        std::fs::create_dir(&run).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join(REPLACED_DIR)).unwrap();
        let e = move_aside(&run, &tmp.path().join(REPLACED_DIR), "run").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(run.is_dir() && std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    }

    /// A rewrite of a run folder cut short before its `run.json` (a full disk; here every
    /// temporary name of `run.json` taken) leaves no `run.json` describing the run before beside
    /// the new script: the next render of either spec rewrites the folder instead of calling it
    /// unchanged, and `run_dirs` (submit, status) names the folder instead of passing it over.
    #[test]
    fn a_rewrite_cut_short_is_rendered_again_not_trusted() {
        let out = tempfile::tempdir().unwrap();
        let (plan, dir) = rendered(out.path());
        let other = Plan::build(
            Spec::parse(
                "cluster: {gpus_per_node: 2, gpu_memory: 16GiB}\nworker: {steps: 7}\nsweep:\n  models: tiny\n  stages: 3\n  offload: optimizer+params\n",
                Path::new("s.yaml"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(other.runs[0].id, plan.runs[0].id, "the same folder");
        let record = dir.join("run.json");
        let taken: Vec<PathBuf> = zerobench_files::temporary_names(&record).collect();
        for t in &taken {
            std::fs::write(t, "").unwrap();
        }
        assert!(render(&other, out.path()).is_err());
        assert!(std::fs::read_to_string(dir.join("job.sbatch")).unwrap().contains("--steps 7"));
        assert!(!dir.join("run.json").exists(), "the run before's record beside the new script");
        let e = run_dirs(out.path()).unwrap_err().to_string();
        assert!(e.contains("without its run.json") && e.contains(&plan.runs[0].id), "{e}");
        for t in &taken {
            std::fs::remove_file(t).unwrap();
        }
        assert_eq!(render_with(&plan, out.path(), OnChange::Refuse).unwrap()[0].1, Rendered::Refreshed);
        assert!(!std::fs::read_to_string(dir.join("job.sbatch")).unwrap().contains("--steps 7"));
        assert_eq!(read_record(&dir).unwrap().run.config.steps, plan.runs[0].config.steps);
        assert_eq!(run_dirs(out.path()).unwrap(), [dir]);
    }

    #[test]
    fn open_mpi_ranks_get_the_cores_they_are_given() {
        let local = job_of("launch: {method: local}\nsweep: {models: tiny, ranks_per_node: 2}\n");
        assert!(local.contains("--oversubscribe --bind-to none --mca odls_base_sigkill_timeout 10 -np 2"), "{local}");
        let own =
            job_of("cluster: {cpus_per_task: 8}\nlaunch: {method: mpirun}\nsweep: {models: tiny, ranks_per_node: 4}\n");
        assert!(own.contains("--map-by 'ppr:4:node:PE=8'"), "{own}");
        let one = job_of("launch: {method: mpirun}\nsweep: {models: tiny, ranks_per_node: 4}\n");
        assert!(one.contains("--map-by ppr:4:node "), "{one}");
    }
}
