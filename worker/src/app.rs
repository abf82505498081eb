//! One rank's run from flags to exit code.
//!
//! Order of work: flags are checked before anything else; then the rank meets the others (over MPI,
//! or at a TCP store: [`rendezvous`]), learns who it is, and the ranks agree ([`agree`]) that
//! they all have one configuration, that each found its device (all of one kind, no two on one
//! GPU) and that every log opened: a rank that fails any of these stops every rank here, before
//! any training; then the `start` record is written, the communicators are built (a failure to
//! start them is logged after `start`), then the model and the ZeRO engine, and the steps run.
//! Every record is flushed as it is written. A failure after the log is open is logged as an
//! `error` record and an `end` record with the exit code that follows (see [`crate::failure`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use tch::Device;
use zerobench_schema::log::{DeviceInfo, End, ErrorRecord, ModelInfo, RunStatus, Setup, Start, Versions};
use zerobench_schema::memory::{host_params, model_state_split, padded_params, StateSplit};
use zerobench_schema::{DeviceRequest, Offload, Record, RunConfig, SCHEMA_VERSION};

use std::sync::Arc;

use crate::comm::group::HostGroup;
use crate::comm::nccl::NcclCollectives;
use crate::comm::solo::SoloCollectives;
use crate::comm::{self, Backend, Collectives};
use crate::failure::{Failure, Refused};
use crate::logfile::{now_ts, RankLog};
use crate::metrics::clock::StepClock;
use crate::metrics::gpu_monitor::GpuMonitor;
use crate::metrics::memory::MemoryProbe;
use crate::metrics::timeline::{write_chrome_trace, Timeline};
use crate::model::Model;
use crate::runtime::cpus::{CpuError, LaunchCpu};
use crate::runtime::cuda::{ComputeStream, Gpu};
use crate::runtime::guard::{Guard, StopSignals};
use crate::runtime::identity::{self, Identity};
use crate::runtime::rendezvous;
use crate::train::{Observe, Progress, TorchProfile, Trainer};
use crate::{agree, cli, data, model, runtime, zero};

/// Runs one rank; the error's [`Failure::exit_code`] is the process's exit code.
pub fn run(args: &cli::Args) -> Result<(), Failure> {
    let cfg = args.config();
    cfg.validate(None)?;
    if let Some(threads) = args.threads {
        let most = std::thread::available_parallelism().map_or(1, |n| n.get()).saturating_mul(4);
        if threads as usize > most {
            return Err(Refused::Threads { threads, most }.into());
        }
    }
    // A step the run never reaches would record nothing. (Without `--profile-step`,
    // `--torch-profile` records the first measured step, which `validate` keeps in the run.)
    if let Some(step) = args.profile_step.filter(|&s| s >= cfg.steps) {
        return Err(Refused::ProfileStepPastRun { step, steps: cfg.steps }.into());
    }
    if let (DeviceRequest::Cpu, LaunchCpu::Cpu(cpu)) = (cfg.device, args.launch_cpu) {
        return Err(Refused::LaunchCpuWithoutGpu(cpu).into());
    }
    // Refuse what the worker cannot build before any rank starts communicating.
    let model = model::build(&cfg.model.spec()).map_err(Refused::Model)?;

    // One GPU per local rank, chosen before MPI (which may initialise CUDA) and before libtorch:
    // by the launcher's local rank, checked once the ranks have met.
    let gpu_hint = identity::local_rank_hint();
    let visible = (cfg.device != DeviceRequest::Cpu).then(|| runtime::cuda::bind_local_gpu(gpu_hint.unwrap_or(0)));
    let timeout = Duration::from_secs(args.rendezvous_timeout_s);
    // `_mpi` keeps MPI initialised to the end of the run, when the ranks use it.
    let rendezvous::Ranks { ident, mut host, mpi: _mpi } = rendezvous::join(args.rendezvous, timeout).map_err(|e| {
        if e.is_config() {
            Failure::Config(Refused::Launch(e))
        } else {
            Failure::Comm(e.to_string())
        }
    })?;
    runtime::fatal::set_rank(ident.rank);
    // The rules that depend on the number of ranks (hpZ's group size).
    cfg.validate(Some(ident.world_size))?;
    let run_id = shared_run_id(&mut host, args.run_id.as_deref(), &cfg)?;
    agree::same_configuration(&mut host, &cfg)?;
    // The device and the CPU its launches are pinned to, before the log: a rank without its GPU
    // is refused as a bad flag is, and every rank stops with it.
    let t_setup = Instant::now();
    let placed = open_device(&cfg, &ident, gpu_hint).and_then(|(device, gpu)| {
        let launch_cpu = launch_cpu(args.launch_cpu, &ident, gpu.is_some())?;
        let uuid = gpu.as_ref().and_then(|g| g.uuid());
        Ok(Placed { device, gpu, uuid, launch_cpu, t_setup })
    });
    let placed = agree::all_succeed(&mut host, placed, "open its device", drop)?;
    agree::same_placement(&mut host, placed.gpu.as_ref().map(|_| placed.uuid.as_deref().unwrap_or_default()))?;
    // Held to the end of `run`, so that a failed rank 0 can leave without waiting for the others.
    let store = host.run_store();
    let signals = StopSignals::catch().map_err(|e| Failure::Internal(format!("cannot catch the stop signals: {e}")))?;
    let opened = RankLog::create(&args.log_dir, ident.rank, args.overwrite);
    let log = agree::logs_opened(&mut host, opened, &args.log_dir, args.overwrite)?;
    let stall = (args.stall_timeout_s > 0).then(|| Duration::from_secs(args.stall_timeout_s));
    let guard = Guard::start(signals, log.clone(), ident.rank, stall)
        .map_err(|e| Failure::Internal(format!("cannot start the guard threads: {e}")))?;

    let mut progress = Progress { steps_completed: 0, summary: None, trace: Vec::new(), cuda_device: None };
    let rank =
        Rank { args, cfg: &cfg, ident: &ident, run_id: &run_id, log: &log, guard: &guard, model: model.as_ref() };
    let result = catch_unwind(AssertUnwindSafe(|| run_logged(rank, host, placed, visible, &mut progress)))
        .unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(Failure::from_torch_message(&msg))
        });
    if !guard.claim_end() {
        // The guard is stopping this rank (a signal or a stall) and writes the last records.
        loop {
            std::thread::park();
        }
    }
    // A log whose folder was removed during the run holds nothing anyone can read: not a success.
    let result = result.and_then(|()| {
        if log.is_removed() {
            let path = log.path().display();
            Err(Failure::Io(format!("the log {path} was removed during the run: its records are lost")))
        } else {
            Ok(())
        }
    });
    // The trace asked for is part of the result: one that cannot be written fails the run.
    let result = result.and_then(|()| {
        if !args.trace || progress.trace.is_empty() {
            return Ok(());
        }
        let path = args.log_dir.join(format!("trace-rank{}.json", ident.rank));
        write_chrome_trace(&path, ident.rank, &progress.trace, args.overwrite).map_err(|e| {
            let why = if e.cause.kind() == std::io::ErrorKind::AlreadyExists {
                "it exists (--overwrite replaces it)".to_string()
            } else {
                e.cause.to_string()
            };
            Failure::Io(format!("cannot write the trace {}: {why}", path.display()))
        })
    });
    if let (Err(_), Some(s)) = (&result, &store) {
        s.abandon();
    }
    let (status, exit_code) = match &result {
        Ok(()) => (RunStatus::Ok, 0),
        Err(f @ Failure::Oom { .. }) => (RunStatus::Oom, f.exit_code()),
        Err(f) => (RunStatus::Failed, f.exit_code()),
    };
    if let Err(f) = &result {
        let requested_bytes = match f {
            Failure::Oom { requested_bytes, .. } => *requested_bytes,
            _ => None,
        };
        let err = ErrorRecord {
            v: SCHEMA_VERSION,
            ts: now_ts(),
            rank: ident.rank,
            class: f.class(),
            message: f.to_string(),
            step: Some(progress.steps_completed),
            requested_bytes,
            memory: Some(MemoryProbe::new(progress.cuda_device).sample()),
        };
        // Best effort: the failure itself may be the log's.
        let _ = log.write(&Record::Error(err));
    }
    let end = End {
        v: SCHEMA_VERSION,
        ts: now_ts(),
        rank: ident.rank,
        status,
        steps_completed: progress.steps_completed,
        exit_code,
        summary: progress.summary,
    };
    let _ = log.write_end(&Record::End(end));
    guard.ended();
    if ident.rank == 0 {
        if let Some(s) = progress.summary {
            crate::say!(
                "zerobench-worker: {} stage {} on {} rank(s): {:.1} ms/step, {:.0} tokens/s, final loss {}",
                cfg.model,
                cfg.stage,
                ident.world_size,
                s.step_ms_median,
                s.tokens_per_s,
                s.final_loss_text()
            );
        }
    }
    result
}

/// The run id: given, or made on rank 0 and broadcast so every rank logs the same.
fn shared_run_id(host: &mut HostGroup, given: Option<&str>, cfg: &RunConfig) -> Result<String, Failure> {
    if let Some(id) = given {
        return Ok(id.to_string());
    }
    let mut buf = [0u8; 128];
    if host.rank() == 0 {
        let id = format!("{}_z{}_{}_{}", cfg.model, cfg.stage, now_ts() as u64, std::process::id());
        let n = id.len().min(buf.len());
        buf[..n].copy_from_slice(&id.as_bytes()[..n]);
    }
    host.broadcast_bytes(&mut buf, 0)?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// What `run` settled around the log's opening: the rank's flags, configuration, identity, log,
/// guard threads and model.
#[derive(Clone, Copy)]
struct Rank<'a> {
    args: &'a cli::Args,
    cfg: &'a RunConfig,
    ident: &'a Identity,
    run_id: &'a str,
    log: &'a RankLog,
    guard: &'a Guard,
    model: &'a dyn Model,
}

/// Where the rank computes, settled before its log opened: the device, its CUDA context and UUID
/// when it is a GPU, and the CPU its launching threads are pinned to; `t_setup` is when the device began
/// to open (the `setup` record's `setup_ms` counts from it).
struct Placed {
    device: Device,
    gpu: Option<Arc<Gpu>>,
    /// The GPU's UUID, where the driver gives it.
    uuid: Option<String>,
    launch_cpu: Option<usize>,
    t_setup: Instant,
}

fn run_logged(
    rank: Rank<'_>,
    host: HostGroup,
    placed: Placed,
    visible: Option<String>,
    progress: &mut Progress,
) -> Result<(), Failure> {
    let Rank { args, cfg, ident, log, guard, model, .. } = rank;
    let Placed { device, gpu, uuid, launch_cpu, t_setup } = placed;
    let monitor = uuid.as_deref().and_then(GpuMonitor::open).map(Arc::new);
    let threads = set_threads(args, cfg, ident, gpu.is_some());
    let cuda_index = match device {
        Device::Cuda(i) => Some(i),
        _ => None,
    };
    progress.cuda_device = cuda_index;
    guard.set_cuda_device(cuda_index);
    // The `start` record first: a communicator that fails to start is logged after it.
    let backend = Backend::of(&host, gpu.is_some(), cfg.cuda_graph);
    let start = start_record(&rank, gpu.as_ref(), cuda_index, visible, threads, launch_cpu, backend);
    log.write(&Record::Start(start)).map_err(|e| Failure::Io(e.to_string()))?;
    guard.start_logged();
    let (comm, group) = communicators(cfg, backend, host, gpu.as_ref())?;
    let data = training_data(cfg, ident, device)?;
    let expected = expected_states(cfg, ident);
    // Before any state is allocated: host-resident states that cannot fit are a result (oom).
    let step_batches = crate::data::Task::of(cfg).step_bytes(cfg.micro_batch, cfg.grad_accum);
    let per_rank = runtime::host_memory::host_resident(&expected, step_batches, cuda_index.is_none());
    runtime::host_memory::check(per_rank, ident.local_size, runtime::host_memory::available_bytes())?;
    let mut engine = zero::Engine::new(model, cfg, comm, group, device, gpu.clone())?;
    let probe = MemoryProbe::new(cuda_index);
    let setup = Setup {
        v: SCHEMA_VERSION,
        ts: now_ts(),
        rank: ident.rank,
        model_state: engine.model_state_bytes(),
        model_state_expected: expected.device,
        padded_params: engine.padded_params(),
        buffers_bytes: engine.buffer_bytes(),
        host_state_bytes: engine.host_state_bytes(),
        host_state_expected_bytes: Some(expected.host_bytes),
        optimizer: Some(engine.optimizer_implementation()),
        host_state_setup_ms: engine.host_setup_ms(),
        memory: probe.sample(),
        setup_ms: t_setup.elapsed().as_secs_f64() * 1e3,
    };
    log.write(&Record::Setup(setup)).map_err(|e| Failure::Io(e.to_string()))?;

    let timeline = Timeline::new(gpu.clone()).map_err(|e| Failure::Internal(e.to_string()))?;
    let mut trainer = Trainer {
        cfg,
        model,
        engine: &mut engine,
        data: &data,
        log,
        guard,
        probe: &probe,
        monitor,
        launch_cpu,
        gpu: gpu.clone(),
        clock: StepClock::new(gpu.clone()),
        observe: Observe {
            timeline,
            trace: args.trace,
            profile_step: args.profile_step,
            torch_profile: args.torch_profile_step().map(|step| TorchProfile {
                step,
                path: args.log_dir.join(format!("torch-profile-rank{}.json", ident.rank)),
            }),
        },
        rank: ident.rank,
    };
    trainer.run(progress)
}

/// The samples this rank trains on: seeded, or from `--data`.
fn training_data(cfg: &RunConfig, ident: &Identity, device: Device) -> Result<data::Data, Failure> {
    let task = data::Task::of(cfg);
    let source = data::Source::open(cfg.data.as_deref(), cfg.model.spec().vocab(), &task, cfg.eval_every.is_some())
        .map_err(|e| Failure::Io(e.to_string()))?;
    Ok(data::Data::new(
        source,
        task,
        cfg.seed,
        cfg.micro_batch as usize,
        ident.world_size as usize,
        cfg.grad_accum as usize,
        ident.rank as usize,
        device,
    ))
}

/// What the ZeRO formulas give for this rank's model states, on the device and on the host.
fn expected_states(cfg: &RunConfig, ident: &Identity) -> StateSplit {
    let (spec, world_size) = (cfg.model.spec(), u64::from(ident.world_size));
    model_state_split(
        cfg.stage,
        cfg.precision,
        cfg.offload,
        cfg.grad_accum,
        padded_params(&spec, world_size),
        host_params(&spec, world_size, cfg.host_share()),
        world_size,
    )
}

/// The device this rank computes on, checked against the launcher's local rank, and its CUDA
/// context when it is a GPU.
fn open_device(
    cfg: &RunConfig,
    ident: &Identity,
    gpu_hint: Option<u32>,
) -> Result<(Device, Option<Arc<Gpu>>), Failure> {
    let device = runtime::device::select(cfg.device).map_err(Refused::from)?;
    // The GPU was bound by the launcher's local rank, before the ranks met and CUDA started.
    if matches!(device, Device::Cuda(_)) && gpu_hint.unwrap_or(0) != ident.local_rank {
        return Err(
            Refused::LocalRank { hint: gpu_hint, local_rank: ident.local_rank, local_size: ident.local_size }.into()
        );
    }
    let stream = if cfg.cuda_graph { ComputeStream::Own } else { ComputeStream::Legacy };
    let gpu = match device {
        Device::Cuda(i) => Some(Gpu::new(i, stream).map_err(|e| Failure::Internal(format!("CUDA context: {e}")))?),
        _ if cfg.cuda_graph => return Err(Refused::CudaGraphWithoutGpu.into()),
        _ => None,
    };
    if let Some(g) = &gpu {
        crate::model::lm_head::install_cuda(g);
        crate::model::recompute_cuda::install(g);
    }
    Ok((device, gpu))
}

/// The collectives of the world, and of this rank's hpZ group when the run uses hpZ.
type Communicators = (Box<dyn Collectives>, Option<Box<dyn Collectives>>);

/// The world's collectives over `backend` ([`Backend::of`]) and, with hpZ, the group's.
fn communicators(
    cfg: &RunConfig,
    backend: Backend,
    host: HostGroup,
    gpu: Option<&Arc<Gpu>>,
) -> Result<Communicators, Failure> {
    // hpZ: the ranks of this rank's group (consecutive ranks, a node) get a communicator of
    // their own. Splitting is collective: every rank takes part.
    let group_host = cfg.engine.hpz.map(|g| host.split_consecutive(g));
    if cfg.engine.copy_engines.is_some() && gpu.is_none() {
        return Err(Refused::CopyEnginesWithoutGpu.into());
    }
    let comm: Box<dyn Collectives> = match (backend, gpu) {
        (Backend::Nccl, Some(g)) => {
            Box::new(NcclCollectives::new(host, Arc::clone(g), cfg.engine.comm_ctas, cfg.engine.copy_engines)?)
        }
        (Backend::None, Some(_)) => Box::new(SoloCollectives),
        _ => comm::cpu_collectives(host)?,
    };
    let group: Option<Box<dyn Collectives>> = match (group_host, gpu) {
        (None, _) => None,
        (Some(c), Some(g)) => {
            Some(Box::new(NcclCollectives::new(c, Arc::clone(g), cfg.engine.comm_ctas, cfg.engine.copy_engines)?))
        }
        (Some(c), None) => Some(comm::cpu_collectives(c)?),
    };
    Ok((comm, group))
}

/// Sets libtorch's and the CPU optimizer's thread counts; returns libtorch's.
fn set_threads(args: &cli::Args, cfg: &RunConfig, ident: &Identity, on_gpu: bool) -> u32 {
    let threads = args.threads.unwrap_or_else(|| runtime::cpus::default_threads(ident.local_size));
    tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
    // With GPU offload the CPU optimizer runs on the rayon pool while this thread keeps launching
    // the GPU's work; one of the rank's cores stays free for it, or the GPU waits for launches.
    let pool = if on_gpu && cfg.offload != Offload::None { threads.saturating_sub(1).max(1) } else { threads };
    // The pool's threads run the CPU optimizer's loops: a crash there is reported with its frames.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(pool as usize)
        .start_handler(|_| {
            let _ = runtime::fatal::signal_stack_for_this_thread();
        })
        .build_global();
    threads
}

/// The CPU a GPU rank's launching threads are pinned to from its first backward pass, if any.
fn launch_cpu(choice: LaunchCpu, ident: &Identity, on_gpu: bool) -> Result<Option<usize>, Failure> {
    match (on_gpu, choice) {
        (false, LaunchCpu::Cpu(cpu)) => Err(Refused::LaunchCpuWithoutGpu(cpu).into()),
        (false, _) => Ok(None),
        (true, choice) => runtime::cpus::launch_cpu(choice, ident.local_rank, ident.local_size).map_err(|e| match e {
            e @ CpuError::NotAllowed { .. } => Refused::LaunchCpu(e).into(),
            e => Failure::Internal(e.to_string()),
        }),
    }
}

/// The rank's `start` record: who it is, what it runs, on what (with its intra-op threads and
/// the CPU of its launching threads), with which versions.
fn start_record(
    rank: &Rank<'_>,
    gpu: Option<&Arc<Gpu>>,
    cuda_index: Option<usize>,
    visible: Option<String>,
    threads: u32,
    launch_cpu: Option<usize>,
    backend: Backend,
) -> Start {
    let (cfg, ident) = (rank.cfg, rank.ident);
    let spec = cfg.model.spec();
    let on_gpu = cuda_index.is_some();
    let (device_name, total_memory_bytes) = match gpu {
        Some(g) => g.describe(),
        None => (runtime::machine::cpu_name(), None),
    };
    Start {
        v: SCHEMA_VERSION,
        ts: now_ts(),
        run_id: rank.run_id.to_string(),
        rank: ident.rank,
        world_size: ident.world_size,
        local_rank: ident.local_rank,
        local_size: ident.local_size,
        node_rank: ident.node_rank,
        nodes: ident.nodes,
        rank_source: ident.source.to_string(),
        host: identity::hostname(),
        machine: Some(runtime::machine::machine()),
        pid: std::process::id(),
        config: cfg.clone(),
        model: ModelInfo {
            family: spec.family().to_string(),
            params: spec.param_count(),
            units: u32::try_from(spec.units().len()).unwrap_or(u32::MAX),
            largest_unit_params: spec.largest_unit_params(),
            train_flops_per_token: Some(cfg.train_flops_per_token()),
        },
        device: DeviceInfo {
            kind: if on_gpu { "cuda".into() } else { "cpu".into() },
            name: device_name,
            index: cuda_index.map(|i| i as u32),
            total_memory_bytes,
            cuda_visible_devices: if on_gpu { visible } else { None },
            threads,
            launch_cpu: launch_cpu.map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
        },
        comm_backend: backend.name().into(),
        versions: Versions {
            zerobench: env!("CARGO_PKG_VERSION").into(),
            commit: zerobench_build_info::COMMIT.map(Into::into),
            libtorch: runtime::shim::torch_version(),
            mpi: mpi::environment::library_version().ok().map(|v| {
                v.lines().next().unwrap_or("").trim_matches(|c: char| c == '\0' || c.is_whitespace()).to_string()
            }),
            nccl: if on_gpu { NcclCollectives::version() } else { None },
            cuda_driver: gpu.and_then(|g| g.driver_version()),
            gpu_driver: if on_gpu { GpuMonitor::driver_version() } else { None },
        },
        slurm: identity::slurm_info(),
    }
}
