//! Fixtures: run logs written with the schema's types (valid by construction), hand-made corrupt
//! files, and helpers to read them and to make outputs independent of the temporary folder.

use std::fs;
use std::path::{Path, PathBuf};

use zerobench_ingest::synth::{Fate, SynthRun};
use zerobench_ingest::{ingest, Ingested, NoProgress, Options};
use zerobench_schema::{ModelPreset, RunConfig, ZeroStage};

/// A configuration with 6 steps, 2 of them warmup.
pub fn cfg(model: ModelPreset, stage: ZeroStage, micro_batch: u32) -> RunConfig {
    let mut c = RunConfig::new(model, stage);
    c.micro_batch = micro_batch;
    c.steps = 6;
    c.warmup = 2;
    c
}

pub fn run(id: &str, model: ModelPreset, stage: ZeroStage, mbs: u32, gpus: u32, step_ms: f64) -> SynthRun {
    let mut r = SynthRun::new(id, cfg(model, stage, mbs), gpus, step_ms);
    r.seed = id.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    r
}

pub fn read(root: &Path) -> Ingested {
    read_with(root, &Options::default())
}

pub fn read_with(root: &Path, opts: &Options) -> Ingested {
    ingest(&[root.to_path_buf()], opts, &NoProgress)
}

/// Replaces the temporary root in `text` by `[ROOT]`.
pub fn redact(text: &str, root: &Path) -> String {
    text.replace(&root.display().to_string(), "[ROOT]")
}

/// The folder of the foreign-log fixtures (excerpts of the public DeepSpeed studies).
pub fn foreign_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/foreign")
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Inserts `extra` lines into a rank log after its line `after` (1-based).
pub fn insert_lines(path: &Path, after: usize, extra: &[&[u8]]) {
    let text = fs::read(path).unwrap();
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        out.extend_from_slice(l);
        out.push(b'\n');
        if i + 1 == after {
            for e in extra {
                out.extend_from_slice(e);
                out.push(b'\n');
            }
        }
    }
    fs::write(path, out).unwrap();
}

/// The fixed log set of the golden tests: a sweep with an OOM, a scaling series with a
/// multi-node point, a failed, a killed, a cancelled, a timed-out run, one with a missing rank,
/// one with corrupt lines, and the foreign fixtures beside them.
pub fn golden_set(root: &Path) {
    use ModelPreset::{Gpt2, Gpt2Medium};
    use ZeroStage::{Z0, Z1, Z2, Z3};
    let sweep = root.join("sweep");
    for stage in ZeroStage::ALL {
        for mbs in [4, 8] {
            let id = format!("gpt2-z{stage}-mbs{mbs}-g2");
            let base = 40.0 + f64::from(mbs) * 5.0 + f64::from(stage.index()) * 3.0;
            run(&id, Gpt2, stage, mbs, 2, base).write(&sweep.join(&id).join("logs")).unwrap();
        }
    }
    let mut oom = run("gpt2-z0-mbs16-g2", Gpt2, Z0, 16, 2, 120.0);
    oom.fate = Fate::Oom { rank: 1, step: 3 };
    oom.write(&sweep.join("gpt2-z0-mbs16-g2/logs")).unwrap();
    run("gpt2-z3-mbs16-g2", Gpt2, Z3, 16, 2, 130.0).write(&sweep.join("gpt2-z3-mbs16-g2/logs")).unwrap();

    let scaling = root.join("scaling");
    for gpus in [1, 2, 4] {
        let id = format!("gpt2-medium-z2-mbs4-g{gpus}");
        run(&id, Gpt2Medium, Z2, 4, gpus, 80.0 + f64::from(gpus)).write(&scaling.join(&id).join("logs")).unwrap();
    }
    let mut multi = run("gpt2-medium-z2-mbs4-g8-2nodes", Gpt2Medium, Z2, 4, 8, 92.0);
    multi.nodes = 2;
    multi.write(&scaling.join("gpt2-medium-z2-mbs4-g8-2nodes/logs")).unwrap();
    run("gpt2-medium-z2-mbs4-g8-1node", Gpt2Medium, Z2, 4, 8, 86.0)
        .write(&scaling.join("gpt2-medium-z2-mbs4-g8-1node/logs"))
        .unwrap();

    let faults = root.join("faults");
    let mut failed = run("gpt2-medium-z3-mbs4-g2-failed", Gpt2Medium, Z3, 4, 2, 95.0);
    failed.fate = Fate::Failed { rank: 0, step: 4 };
    failed.write(&faults.join("gpt2-medium-z3-mbs4-g2-failed/logs")).unwrap();
    let mut killed = run("gpt2-medium-z3-mbs8-g2-killed", Gpt2Medium, Z3, 8, 2, 150.0);
    killed.fate = Fate::Killed { after: 4 };
    killed.write(&faults.join("gpt2-medium-z3-mbs8-g2-killed/logs")).unwrap();
    run("gpt2-medium-z1-mbs4-g4-missing", Gpt2Medium, Z1, 4, 4, 85.0)
        .write_ranks(&faults.join("gpt2-medium-z1-mbs4-g4-missing/logs"), [0, 1])
        .unwrap();
    let mut cancelled = run("gpt2-medium-z1-mbs8-g2-cancelled", Gpt2Medium, Z1, 8, 2, 140.0);
    cancelled.fate = Fate::Killed { after: 3 };
    let dir = faults.join("gpt2-medium-z1-mbs8-g2-cancelled");
    cancelled.write(&dir.join("logs")).unwrap();
    fs::write(dir.join("job.json"), r#"{"job_id": "4242", "state": "CANCELLED by 1000"}"#).unwrap();
    let mut timeout = run("gpt2-medium-z0-mbs8-g2-timeout", Gpt2Medium, Z0, 8, 2, 145.0);
    timeout.fate = Fate::Killed { after: 5 };
    let dir = faults.join("gpt2-medium-z0-mbs8-g2-timeout");
    timeout.write(&dir.join("logs")).unwrap();
    fs::write(
        dir.join("gpt2-medium-z0-mbs8-g2-timeout-4243.out"),
        "step 5\nslurmstepd: error: *** JOB 4243 ON node0 CANCELLED AT 2026-11-20T10:00:00 DUE TO TIME LIMIT ***\n",
    )
    .unwrap();

    // Hand-made corruption in an otherwise complete run: the run is still read, each bad line
    // is reported with its line number.
    let id = "gpt2-medium-z0-mbs4-g2-corrupt";
    run(id, Gpt2Medium, Z0, 4, 2, 90.0).write(&faults.join(id).join("logs")).unwrap();
    insert_lines(
        &faults.join(id).join("logs/rank1.jsonl"),
        4,
        &[
            b"this is not json",
            b"\x00\x01\x02\xff\xfe binary",
            br#"{"event":"step","v":99,"rank":1,"step":9}"#,
            br#"{"event":"step","rank":1}"#,
            br#"{"event":"step","v":1,"rank":1,"step":3,"loss":1.0}"#,
            b"",
        ],
    );

    copy_dir(&foreign_fixtures(), &root.join("foreign"));
}

/// A Hugging Face Trainer's closing summary line, with `steps_per_s` as its steps per second.
pub fn trainer_summary(steps_per_s: f64) -> String {
    format!(
        "{{'train_runtime': 742.5369, 'train_samples_per_second': 227.686, 'train_steps_per_second': {steps_per_s:?}, \
         'train_loss': 0.16859441952772136, 'epoch': 3.0}}\n"
    )
}
