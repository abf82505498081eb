//! Bad input: every problem is reported with its file, line and reason, and never stops the
//! rest from being read.

use std::fs;
use std::path::Path;

use zerobench_ingest::synth::{Fate, SynthRun};
use zerobench_ingest::{ingest, NoProgress, Options, Problem, ProblemKind, Status};
use zerobench_schema::{ModelPreset, ZeroStage, SCHEMA_VERSION};

use crate::common::{insert_lines, read, read_with, run};

fn one_run(root: &Path, id: &str) -> std::path::PathBuf {
    let dir = root.join(id);
    run(id, ModelPreset::Gpt2, ZeroStage::Z1, 4, 2, 50.0).write(&dir).unwrap();
    dir
}

fn kinds(problems: &[Problem]) -> Vec<(Option<u64>, ProblemKind)> {
    problems.iter().map(|p| (p.line, p.kind.clone())).collect()
}

#[test]
fn corrupt_binary_and_version_lines_are_reported_with_their_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    // rank1.jsonl: start, setup, step 0, step 1, then the bad lines (lines 5..=9).
    insert_lines(
        &dir.join("rank1.jsonl"),
        4,
        &[
            b"{\"event\":\"step\",\"v\":1,\"rank\":1,",
            b"\x00\xff\xfe\x80garbage",
            br#"{"event":"end","v":7,"rank":1}"#,
            br#"{"event":"setup","rank":1}"#,
            br#"[1,2,3]"#,
        ],
    );
    let got = read(tmp.path());
    let k = kinds(&got.problems);
    assert_eq!(k.len(), 5, "{:#?}", got.problems);
    assert!(matches!(&k[0], (Some(5), ProblemKind::BadLine { message }) if message.contains("EOF")), "{k:?}");
    assert!(matches!(&k[1], (Some(6), ProblemKind::BadLine { .. })), "{k:?}");
    assert_eq!(k[2], (Some(7), ProblemKind::Version { found: 7, supported: SCHEMA_VERSION }));
    assert_eq!(k[3], (Some(8), ProblemKind::NoVersion));
    assert!(matches!(&k[4], (Some(9), ProblemKind::BadLine { .. })), "{k:?}");
    assert!(got.problems.iter().all(|p| p.path.ends_with("rank1.jsonl")));
    // The rest of the file and the run were read.
    let row = &got.runs[0].row;
    assert_eq!((row.status, row.steps_measured, row.ranks_read), (Status::Ok, 4, 2));
    assert_eq!(got.stats.bad_lines, 5);
}

#[test]
fn truncated_last_line_is_reported_and_the_run_is_incomplete() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = run("killed", ModelPreset::Gpt2, ZeroStage::Z2, 4, 2, 50.0);
    r.fate = Fate::Killed { after: 4 };
    r.write(tmp.path()).unwrap();
    let got = read(tmp.path());
    assert_eq!(got.problems.len(), 2);
    for p in &got.problems {
        // start, setup, 4 steps, then the partial line 7.
        assert_eq!(p.line, Some(7));
        assert!(matches!(&p.kind, ProblemKind::Truncated { .. }), "{p}");
    }
    let row = &got.runs[0].row;
    assert_eq!(row.status, Status::Incomplete);
    assert_eq!(row.status_detail.as_deref(), Some("no end record from ranks 0-1"));
    assert_eq!(row.steps_measured, 2);
}

#[test]
fn oversized_line_is_skipped_without_being_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let big = vec![b'x'; (1 << 20) + 10];
    insert_lines(&dir.join("rank0.jsonl"), 3, &[&big]);
    // And a file that is one huge line without a newline.
    fs::write(dir.join("rank1.jsonl"), vec![b'{'; 3 << 20]).unwrap();
    let got = read(tmp.path());
    let k = kinds(&got.problems);
    assert!(k.contains(&(Some(4), ProblemKind::LineTooLong { bytes: (1 << 20) + 10, limit: 1 << 20 })), "{k:?}");
    assert!(k.contains(&(Some(1), ProblemKind::LineTooLong { bytes: 3 << 20, limit: 1 << 20 })), "{k:?}");
    // rank 1 has no start record (its only line is the huge one): it joins the folder's only run.
    assert!(k.contains(&(None, ProblemKind::NoStart)), "{k:?}");
    assert_eq!(got.runs[0].row.status, Status::Incomplete);
}

#[test]
fn unknown_schema_version_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    for rank in 0..2 {
        let p = dir.join(format!("rank{rank}.jsonl"));
        let text = fs::read_to_string(&p)
            .unwrap()
            .replace(&format!("\"v\":{SCHEMA_VERSION},"), &format!("\"v\":{},", SCHEMA_VERSION + 1));
        fs::write(&p, text).unwrap();
    }
    let got = read(tmp.path());
    assert!(got.runs.is_empty());
    assert_eq!(got.problems.len(), 2);
    for p in &got.problems {
        assert_eq!(
            (p.line, &p.kind),
            (Some(1), &ProblemKind::Version { found: u64::from(SCHEMA_VERSION) + 1, supported: SCHEMA_VERSION })
        );
    }
}

#[test]
fn empty_folders_and_empty_files() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("a/b/c")).unwrap();
    let got = read(tmp.path());
    assert!(got.runs.is_empty() && got.problems.is_empty() && got.complete());
    fs::write(tmp.path().join("a/rank0.jsonl"), b"").unwrap();
    let got = read(tmp.path());
    assert!(got.runs.is_empty());
    assert_eq!(kinds(&got.problems), [(None, ProblemKind::NoStart)]);
    let missing = read(&tmp.path().join("nope"));
    assert!(matches!(&missing.problems[0].kind, ProblemKind::Io { .. }));
}

#[test]
fn unreadable_files_and_dangling_links_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    one_run(tmp.path(), "good");
    let bad = tmp.path().join("bad");
    fs::create_dir_all(&bad).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("does-not-exist"), bad.join("rank0.jsonl")).unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1);
    assert_eq!(got.runs[0].row.status, Status::Ok);
    assert!(
        // With the system's reason, not only its kind.
        got.problems.iter().any(|p| p.path.ends_with("bad/rank0.jsonl")
            && matches!(&p.kind, ProblemKind::Io { message } if message.contains("No such file or directory"))),
        "{:#?}",
        got.problems
    );

    // A file without read permission (only meaningful when not running as root).
    let locked = tmp.path().join("locked");
    let dir = one_run(&locked, "r");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir.join("rank1.jsonl"), fs::Permissions::from_mode(0o000)).unwrap();
    if fs::read(dir.join("rank1.jsonl")).is_err() {
        let got = read(&locked);
        assert!(got.problems.iter().any(|p| matches!(p.kind, ProblemKind::Io { .. })));
        assert_eq!(got.runs[0].row.ranks_read, 1);
    }
}

#[test]
fn symlink_loops_are_reported_and_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    one_run(tmp.path(), "r");
    std::os::unix::fs::symlink(tmp.path(), tmp.path().join("r/loop")).unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1);
    assert_eq!(got.runs[0].row.ranks_read, 2);
    assert_eq!(got.problems.len(), 1, "{:#?}", got.problems);
    assert!(matches!(got.problems[0].kind, ProblemKind::SymlinkLoop { .. }));
    // Given twice, or with a folder inside it given after it, the loop is still one problem and
    // the run one run.
    let root = tmp.path().to_path_buf();
    for roots in [[root.clone(), root.clone()], [root.clone(), root.join("r")]] {
        let again = ingest(&roots, &Options::default(), &NoProgress);
        assert_eq!(again.problems, got.problems, "{roots:?}");
        assert_eq!(again.runs.len(), 1, "{roots:?}");
        assert_eq!(again.runs[0].row.ranks_read, 2, "{roots:?}");
    }
}

/// `line` without its top-level `key` and the comma that separates it.
fn without_key(line: &str, key: &str) -> String {
    let start = line.find(&format!("\"{key}\":")).unwrap();
    let mut depth = 0;
    let (len, _) = line[start..]
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '{' => depth += 1,
                '}' if depth > 0 => depth -= 1,
                '}' | ',' => return true,
                _ => {}
            }
            false
        })
        .unwrap();
    let end = start + len;
    if line[end..].starts_with(',') {
        format!("{}{}", &line[..start], &line[end + 1..])
    } else {
        format!("{}{}", &line[..start - 1], &line[end..])
    }
}

/// Whatever the form of a step line (the writer's, which the fast scanner reads; with a space,
/// which it leaves to the schema's parser; with another first key, which goes to that parser
/// directly), the schema alone decides: a valid record counts the same, and a record without a
/// field the schema requires is refused, even one ingest does not use.
#[test]
fn step_lines_are_held_to_the_schema_in_every_form() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let before = read(tmp.path()).runs[0].row.clone();
    let path = dir.join("rank1.jsonl");
    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let forms = |line: &str| {
        let rest = line.strip_prefix(r#"{"event":"step","v":2,"#).unwrap();
        [line.to_string(), format!(r#"{{"event":"step","v":2, {rest}"#), format!(r#"{{"v":2,"event":"step",{rest}"#)]
    };
    // Steps 0 and 1 (lines 3 and 4) rewritten in the other two forms: the same figures.
    let mut rewritten: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    rewritten[2] = forms(lines[2])[1].clone();
    rewritten[3] = forms(lines[3])[2].clone();
    let mut bad = Vec::new();
    for key in ["ts", "warmup", "skipped", "comm", "memory"] {
        bad.extend(forms(&without_key(lines[3], key)).map(|l| (key, l)));
    }
    let at = rewritten.len();
    rewritten.extend(bad.iter().map(|(_, l)| l.clone()));
    fs::write(&path, rewritten.join("\n") + "\n").unwrap();

    let got = read(tmp.path());
    assert_eq!(got.runs[0].row, before);
    assert_eq!(got.problems.len(), bad.len(), "{:#?}", got.problems);
    for (p, (key, line)) in got.problems.iter().zip(&bad) {
        assert!(p.line.is_some_and(|n| n as usize > at), "{p}");
        let missing = format!("missing field `{key}`");
        assert!(matches!(&p.kind, ProblemKind::BadLine { message } if message.contains(&missing)), "{p}\n{line}");
    }
}

#[test]
fn records_that_contradict_their_file_or_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let step = fs::read_to_string(dir.join("rank1.jsonl")).unwrap().lines().nth(3).unwrap().to_string();
    insert_lines(
        &dir.join("rank1.jsonl"),
        4,
        &[
            step.replacen("\"rank\":1,", "\"rank\":0,", 1).as_bytes(),
            step.replacen("\"step\":1,", "\"step\":99,", 1).as_bytes(),
            step.replacen("\"step_ms\":", "\"step_ms\":-", 1).as_bytes(),
        ],
    );
    // Another run's rank log in the same folder, claiming rank 1 of a 4-rank world.
    let mut other = run("r", ModelPreset::Gpt2, ZeroStage::Z1, 4, 4, 50.0);
    other.seed = 9;
    other.write_ranks(&tmp.path().join("r/sub"), [1]).unwrap();
    fs::rename(tmp.path().join("r/sub/rank1.jsonl"), dir.join("rank-01.jsonl")).unwrap();
    let got = read(tmp.path());
    let k = kinds(&got.problems);
    assert!(k.contains(&(Some(5), ProblemKind::WrongRank { expected: 1, found: 0 })), "{k:?}");
    assert!(k.contains(&(Some(6), ProblemKind::StepOutOfRange { step: 99, steps: 6 })), "{k:?}");
    assert!(
        k.iter().any(
            |(l, p)| *l == Some(7) && matches!(p, ProblemKind::BadLine { message } if message.contains("negative"))
        ),
        "{k:?}"
    );
    assert!(
        k.iter().any(|(_, p)| matches!(p, ProblemKind::Inconsistent { what, .. } if what.contains("world size 4"))),
        "{k:?}"
    );
    assert_eq!(got.runs[0].row.status, Status::Ok);
}

#[test]
fn duplicate_ranks_and_problem_flood_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    fs::copy(dir.join("rank1.jsonl"), dir.join("rank_1.jsonl")).unwrap();
    let junk: Vec<Vec<u8>> = (0..500).map(|i| format!("junk {i}").into_bytes()).collect();
    let junk: Vec<&[u8]> = junk.iter().map(Vec::as_slice).collect();
    insert_lines(&dir.join("rank0.jsonl"), 2, &junk);
    // Small ranges, so the flood is split over many pieces of work.
    let got = read_with(tmp.path(), &Options { chunk_bytes: 1000, ..Options::default() });
    assert!(got.problems.iter().any(|p| matches!(&p.kind, ProblemKind::DuplicateRank { rank: 1, .. })));
    let listed: Vec<&Problem> = got.problems.iter().filter(|p| p.path.ends_with("rank0.jsonl")).collect();
    assert_eq!(listed.len(), 21);
    assert_eq!(listed[0].line, Some(3));
    assert_eq!(listed[19].line, Some(22));
    assert_eq!(listed[20].kind, ProblemKind::More { count: 480 });
    assert_eq!(got.stats.bad_lines, 500);
}

#[test]
fn oom_failed_cancelled_timeout_and_missing_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let mut oom = run("oom", ModelPreset::Gpt2, ZeroStage::Z0, 32, 2, 50.0);
    oom.fate = Fate::Oom { rank: 1, step: 2 };
    oom.write(&tmp.path().join("oom")).unwrap();
    let mut failed = run("failed", ModelPreset::Gpt2, ZeroStage::Z0, 8, 2, 50.0);
    failed.fate = Fate::Failed { rank: 0, step: 4 };
    failed.write(&tmp.path().join("failed")).unwrap();
    for (id, state) in [("cancelled", "CANCELLED"), ("timeout", "TIMEOUT"), ("host-oom", "OUT_OF_MEMORY")] {
        let mut r = run(id, ModelPreset::Gpt2, ZeroStage::Z1, 8, 2, 50.0);
        r.fate = Fate::Killed { after: 3 };
        r.write(&tmp.path().join(id).join("logs")).unwrap();
        fs::write(tmp.path().join(id).join("job.json"), format!(r#"{{"state": {{"current": ["{state}"]}}}}"#)).unwrap();
    }
    // `zerobench local`'s records: a script killed by a signal nobody sent through zerobench
    // (failed, as `status` says), and a run stopped because `local` was interrupted (cancelled).
    for (id, record) in [
        ("local-killed", r#"{"signal": 15, "timed_out": false, "seconds": 3.5, "finished_at": 1}"#),
        (
            "local-interrupted",
            r#"{"exit_code": 143, "timed_out": false, "interrupted_by": "SIGINT", "seconds": 3.5, "finished_at": 1}"#,
        ),
    ] {
        let mut r = run(id, ModelPreset::Gpt2, ZeroStage::Z1, 8, 2, 50.0);
        r.fate = Fate::Killed { after: 2 };
        r.write(&tmp.path().join(id).join("logs")).unwrap();
        fs::write(tmp.path().join(id).join("local.json"), record).unwrap();
    }
    // Slurm's default output name, and the job's own word for a run whose ranks all ended.
    let mut r = run("slurm-out", ModelPreset::Gpt2, ZeroStage::Z1, 8, 2, 50.0);
    r.fate = Fate::Killed { after: 2 };
    r.write(&tmp.path().join("slurm-out/logs")).unwrap();
    fs::write(
        tmp.path().join("slurm-out/slurm-77.out"),
        "slurmstepd: error: *** JOB 77 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***\n",
    )
    .unwrap();
    let done = run("done-but-failed-epilogue", ModelPreset::Gpt2, ZeroStage::Z1, 8, 2, 50.0);
    done.write(&tmp.path().join("epilogue/logs")).unwrap();
    fs::write(tmp.path().join("epilogue/job.json"), r#"{"state": "FAILED"}"#).unwrap();
    // A Slurm state does not override ranks that all finished.
    let done = run("done-then-timeout", ModelPreset::Gpt2, ZeroStage::Z1, 8, 2, 50.0);
    done.write(&tmp.path().join("done/logs")).unwrap();
    fs::write(tmp.path().join("done/job.json"), r#"{"state": "TIMEOUT"}"#).unwrap();
    run("missing", ModelPreset::Gpt2, ZeroStage::Z1, 8, 4, 50.0)
        .write_ranks(&tmp.path().join("missing"), [0, 2])
        .unwrap();

    let got = read(tmp.path());
    let status = |id: &str| {
        got.runs.iter().find(|r| r.row.run_id == id).map(|r| (r.row.status, r.row.status_detail.clone())).unwrap()
    };
    let (s, why) = status("oom");
    assert_eq!(s, Status::Oom);
    assert_eq!(
        why.as_deref(),
        Some("rank 1 at step 2: oom: CUDA out of memory. Tried to allocate 2.00 GiB (requested 2147483648 bytes)")
    );
    assert_eq!(status("failed").0, Status::Failed);
    assert_eq!(status("cancelled").0, Status::Cancelled);
    assert_eq!(status("timeout").0, Status::Timeout);
    assert_eq!(status("host-oom").0, Status::Oom);
    assert_eq!(status("done-then-timeout").0, Status::Ok);
    assert_eq!(status("done-but-failed-epilogue").0, Status::Ok);
    assert_eq!(status("local-killed").0, Status::Failed);
    assert_eq!(status("local-interrupted").0, Status::Cancelled);
    assert_eq!(status("slurm-out").0, Status::Cancelled);
    let (s, why) = status("missing");
    assert_eq!((s, why.as_deref()), (Status::Incomplete, Some("no log for ranks 1,3")));
    assert!(got.problems.iter().any(|p| p.kind
        == ProblemKind::MissingRanks { run_id: "missing".into(), count: 2, world_size: 4, ranks: "1,3".into() }));
    // The OOM run's memory includes the allocator state at the failure.
    let oom_row = &got.runs.iter().find(|r| r.row.run_id == "oom").unwrap().row;
    assert_eq!(oom_row.peak_allocated_bytes, Some(79 << 30));
}

#[test]
fn a_run_folders_job_output_is_not_a_foreign_run() {
    // The launcher's layout: <run>/logs/rank*.jsonl and <run>/<run>-<job>.out with the ranks'
    // console output, which may well quote the errors DeepSpeed logs also print.
    let tmp = tempfile::tempdir().unwrap();
    let mut r = run("r", ModelPreset::Gpt2, ZeroStage::Z0, 64, 2, 50.0);
    r.fate = Fate::Oom { rank: 0, step: 3 };
    r.write(&tmp.path().join("r/logs")).unwrap();
    fs::write(
        tmp.path().join("r/r-4242.out"),
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\ntorch.OutOfMemoryError: CUDA out of memory\n",
    )
    .unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1, "{:#?}", got.runs.iter().map(|r| &r.row.run_id).collect::<Vec<_>>());
    assert_eq!(got.runs[0].row.status, Status::Oom);
}

/// Links out of the folders given are not followed: `ln -s / slash` would read the whole machine
/// (it ran for minutes), and `up -> ..` would ingest a sibling run nobody asked for.
#[test]
fn links_out_of_the_input_are_reported_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    one_run(&input, "asked");
    one_run(&tmp.path().join("sibling"), "not-asked");
    std::os::unix::fs::symlink("/", input.join("slash")).unwrap();
    std::os::unix::fs::symlink("..", input.join("up")).unwrap();
    // A link that stays inside is followed (once: the file it reaches is one file).
    std::os::unix::fs::symlink(input.join("asked"), input.join("alias")).unwrap();
    let t0 = std::time::Instant::now();
    let got = read(&input);
    assert!(t0.elapsed() < std::time::Duration::from_secs(30), "took {:?}", t0.elapsed());
    let ids: Vec<&str> = got.runs.iter().map(|r| r.row.run_id.as_str()).collect();
    assert_eq!(ids, ["asked"], "{:#?}", got.problems);
    let outside: Vec<&Problem> =
        got.problems.iter().filter(|p| matches!(p.kind, ProblemKind::LinkOutside { .. })).collect();
    assert_eq!(outside.len(), 2, "{:#?}", got.problems);
    assert!(outside.iter().any(|p| p.path.ends_with("slash")) && outside.iter().any(|p| p.path.ends_with("up")));
}

/// Rewrites each line of a log with `f`; `None` drops the line.
fn edit_lines(path: &Path, f: impl Fn(serde_json::Value) -> Option<serde_json::Value>) {
    let text = fs::read_to_string(path).unwrap();
    let out: String = text
        .lines()
        .filter_map(|l| f(serde_json::from_str(l).unwrap()))
        .map(|v| format!("{}\n", serde_json::to_string(&v).unwrap()))
        .collect();
    fs::write(path, out).unwrap();
}

/// [`edit_lines`] over both ranks' logs of a run of [`one_run`].
fn edit_ranks(dir: &Path, f: impl Fn(serde_json::Value) -> Option<serde_json::Value>) {
    for rank in 0..2 {
        edit_lines(&dir.join(format!("rank{rank}.jsonl")), &f);
    }
}

fn is_step(v: &serde_json::Value, step: u64) -> bool {
    v["event"] == "step" && v["step"] == step
}

/// A step that no rank wrote is a gap: not a partial step, not a measured one.
#[test]
fn a_step_no_rank_wrote_is_neither_partial_nor_measured() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_ranks(&dir, |v| (!is_step(&v, 3)).then_some(v));
    let row = &read(tmp.path()).runs[0].row;
    // 6 steps, 2 of them warm-up; step 3 missing.
    assert_eq!((row.warmup_steps, row.steps_measured, row.partial_steps), (2, 3, 0));
}

/// A step one rank logged twice and the other not at all is a partial step, not a complete one:
/// a step's ranks are counted once each, not by their records. The same with the lines cut into
/// several ranges.
#[test]
fn a_step_logged_twice_by_one_rank_and_not_by_another_is_partial() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let path = dir.join("rank0.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let step4 = text.lines().find(|l| l.contains("\"event\":\"step\"") && l.contains("\"step\":4,")).unwrap();
    std::fs::write(&path, format!("{text}{step4}\n")).unwrap();
    edit_lines(&dir.join("rank1.jsonl"), |v| (!is_step(&v, 4)).then_some(v));
    for chunk_bytes in [32 << 20, 300] {
        let got = read_with(tmp.path(), &Options { chunk_bytes, ..Options::default() });
        let row = &got.runs[0].row;
        // 6 steps, 2 of them warm-up; step 4 only rank 0's (twice).
        assert_eq!((row.steps_measured, row.partial_steps), (3, 1), "ranges of {chunk_bytes} bytes");
    }
}

/// An energy counter that went back (a reset GPU, a wrapped counter) or stood still (a GPU that
/// does not count) gives no energy figures rather than a negative or a zero one.
#[test]
fn an_energy_counter_that_went_back_or_stood_still_gives_no_energy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let before = read(tmp.path()).runs[0].row.clone();
    assert!(before.energy_j_per_token.is_some_and(|e| e > 0.0) && before.avg_power_w_per_gpu.is_some());
    // The reading at the first measured step (2): the last one set below it, then equal to it.
    let at_step_2 = fs::read_to_string(dir.join("rank1.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| is_step(l, 2))
        .and_then(|l| l["energy_j"].as_f64())
        .unwrap();
    for last in [0.5, at_step_2] {
        edit_lines(&dir.join("rank1.jsonl"), |mut v| {
            if is_step(&v, 5) {
                v["energy_j"] = serde_json::json!(last);
            }
            Some(v)
        });
        let row = &read(tmp.path()).runs[0].row;
        assert_eq!((row.energy_j_per_token, row.avg_power_w_per_gpu), (None, None), "last reading {last}");
    }
}

/// Two logs that both claim rank 0 of a run: the first by name is read, the second reported,
/// and the run's facts (its GPU here) come from the one read.
#[test]
fn of_two_logs_of_one_rank_the_run_is_the_first_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let mut first = run("r", ModelPreset::Gpt2, ZeroStage::Z1, 4, 2, 50.0);
    first.gpu = "GPU A".into();
    first.write(&dir).unwrap();
    let other = tmp.path().join("other");
    SynthRun { gpu: "GPU B".into(), ..first.clone() }.write_ranks(&other, [0]).unwrap();
    fs::rename(other.join("rank0.jsonl"), dir.join("rank_0.jsonl")).unwrap();
    fs::remove_dir(&other).unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs.len(), 1);
    assert_eq!(got.runs[0].row.gpu.as_deref(), Some("GPU A"));
    let duplicate: Vec<&Problem> = got.problems.iter().filter(|p| p.path.ends_with("rank_0.jsonl")).collect();
    assert_eq!(duplicate.len(), 1, "{:?}", got.problems);
}

/// Steps that took no time (a clock that did not move): the collectives keep their time, and
/// no share of a step is made up by dividing by zero.
#[test]
fn steps_of_no_time_have_no_collective_share() {
    let tmp = tempfile::tempdir().unwrap();
    run("zero", ModelPreset::Gpt2, ZeroStage::Z2, 4, 2, 0.0).write(tmp.path()).unwrap();
    let got = read(tmp.path());
    assert_eq!(got.runs[0].row.step_ms_mean, Some(0.0));
    let comm = &got.runs[0].collectives;
    assert!(!comm.is_empty());
    assert!(comm.iter().all(|c| c.ms_per_step > 0.0 && c.step_frac.is_none()), "{comm:#?}");
}

/// Steps skipped for a loss-scale overflow are counted, once per step.
#[test]
fn skipped_steps_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_ranks(&dir, |mut v| {
        if is_step(&v, 3) || is_step(&v, 4) {
            v["skipped"] = serde_json::json!(true);
        }
        Some(v)
    });
    assert_eq!(read(tmp.path()).runs[0].row.skipped_steps, 2);
}

/// Steps that carried no tokens give no energy per token rather than an infinite one.
#[test]
fn steps_without_tokens_give_no_energy_per_token() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_ranks(&dir, |mut v| {
        if v["event"] == "step" {
            v["tokens"] = serde_json::json!(0);
        }
        Some(v)
    });
    assert_eq!(read(tmp.path()).runs[0].row.energy_j_per_token, None);
}

/// Hidden folders below a root hold what is not current (replaced runs, earlier attempts) and
/// are not read; a hidden folder given as the root is.
#[test]
fn hidden_folders_are_read_only_as_roots() {
    let tmp = tempfile::tempdir().unwrap();
    one_run(tmp.path(), "current");
    let old = tmp.path().join(".replaced");
    one_run(&old, "earlier");
    let ids = |root: &Path| -> Vec<String> { read(root).runs.iter().map(|r| r.row.run_id.clone()).collect() };
    assert_eq!(ids(tmp.path()), ["current"]);
    assert_eq!(ids(&old), ["earlier"]);
}

/// Collectives logged with no time give no bandwidth rather than an infinite one.
#[test]
fn collectives_of_no_time_have_no_bandwidth() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_ranks(&dir, |mut v| {
        if let Some(comm) = v.get_mut("comm").and_then(|c| c.as_object_mut()) {
            for c in comm.values_mut() {
                c["ms"] = serde_json::json!(0.0);
                c["bus_gbps"] = serde_json::Value::Null;
            }
        }
        Some(v)
    });
    let got = read(tmp.path());
    let comm = &got.runs[0].collectives;
    assert!(!comm.is_empty() && comm.iter().all(|c| c.bytes_per_step > 0.0 && c.algbw_gbps.is_none()), "{comm:#?}");
}

/// An evaluation's loss is the run's held-out loss, and its exponential the perplexity: the latest
/// evaluation's, whichever rank logged it.
#[test]
fn the_latest_evaluation_is_the_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let eval = |step: u32, loss: f64| {
        format!(
            r#"{{"event":"eval","v":{SCHEMA_VERSION},"ts":1767225610.0,"rank":0,"step":{step},"loss":{loss:?},"samples":32,"eval_ms":12.5}}"#
        )
        .into_bytes()
    };
    // start, setup, 6 steps: the evaluations after steps 3 and 5.
    insert_lines(&dir.join("rank0.jsonl"), 8, &[&eval(3, 3.0), &eval(5, 2.0)]);
    let row = &read(tmp.path()).runs[0].row;
    assert_eq!(row.eval_loss, Some(2.0));
    assert_eq!(row.perplexity, Some(2.0f64.exp()));
}

/// A step some rank did not log is partial only after the warm-up: during it, the step is a
/// warm-up step whoever logged it.
#[test]
fn only_measured_steps_are_partial() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_lines(&dir.join("rank1.jsonl"), |v| (!(is_step(&v, 0) || is_step(&v, 1) || is_step(&v, 4))).then_some(v));
    let row = &read(tmp.path()).runs[0].row;
    assert_eq!((row.warmup_steps, row.partial_steps, row.steps_measured), (2, 1, 3));
}

/// A run whose measured steps are all partial (a rank logged the warm-up only) has no
/// throughput: no step was measured on every rank.
#[test]
fn partial_steps_alone_give_no_throughput() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_lines(&dir.join("rank1.jsonl"), |v| {
        (v["event"] != "step" || v["step"].as_u64().is_some_and(|s| s < 2)).then_some(v)
    });
    let row = &read(tmp.path()).runs[0].row;
    assert_eq!((row.steps_measured, row.partial_steps), (0, 4));
    assert_eq!((row.tokens_per_s, row.samples_per_s), (None, None));
}

/// Only a Slurm job's output (`*.out`) beside a run says how the job ended: a note quoting a
/// time-limit cancellation does not make a killed run a timed-out one.
#[test]
fn only_job_output_files_tell_the_job_state() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = run("killed", ModelPreset::Gpt2, ZeroStage::Z2, 4, 2, 50.0);
    r.fate = Fate::Killed { after: 4 };
    let dir = tmp.path().join("killed");
    r.write(&dir.join("logs")).unwrap();
    let cancelled = "slurmstepd: error: *** JOB 4243 ON node0 CANCELLED AT 2026-11-20T10:00:00 DUE TO TIME LIMIT ***\n";
    fs::write(dir.join("notes.txt"), cancelled).unwrap();
    assert_eq!(read(tmp.path()).runs[0].row.status, Status::Incomplete);
    fs::write(dir.join("killed-4243.out"), cancelled).unwrap();
    assert_eq!(read(tmp.path()).runs[0].row.status, Status::Timeout);
}

/// What was read is counted: every rank's file and every line of it.
#[test]
fn files_and_lines_read_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    one_run(tmp.path(), "r");
    let stats = read(tmp.path()).stats;
    // start, setup, 6 steps and end, on each of 2 ranks.
    assert_eq!((stats.files, stats.lines, stats.bad_lines), (2, 18, 0));
}

/// Throughput and power are over the steps they count. A measured step's line lost on one rank, a
/// rank that stopped writing early, or a log appended to itself leaves tokens/s, and a step's line
/// lost inside the energy counter's window leaves the power and energy per token, where the whole
/// log puts them (every step of one length here), instead of dividing fewer steps' tokens, or more
/// steps' energy, by the time of others. The lost lines are still partial steps.
#[test]
fn throughput_and_power_are_over_the_steps_they_count() {
    let tmp = tempfile::tempdir().unwrap();
    let figures = |name: &str, gpus: u32, edit: &dyn Fn(&Path)| {
        let mut r = run("r", ModelPreset::Gpt2, ZeroStage::Z1, 4, gpus, 50.0);
        r.jitter = 0.0;
        let dir = tmp.path().join(name).join("r");
        r.write(&dir).unwrap();
        edit(&dir);
        let got = read(&tmp.path().join(name));
        let row = got.runs[0].row.clone();
        (row.tokens_per_s.unwrap(), row.avg_power_w_per_gpu, row.energy_j_per_token, row.partial_steps)
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    let drop_step = |dir: &Path, rank: u32, from: u64| {
        edit_lines(&dir.join(format!("rank{rank}.jsonl")), |v| {
            (v["event"] != "step" || v["step"].as_u64() != Some(from)).then_some(v)
        });
    };

    let (whole, _, _, _) = figures("pair", 2, &|_| {});
    let (gap, _, _, partial) = figures("gap", 2, &|d| drop_step(d, 1, 3));
    assert!(close(gap, whole) && partial == 1, "{gap} against {whole}");
    let (cut, _, _, partial) = figures("cut", 2, &|d| {
        edit_lines(&d.join("rank1.jsonl"), |v| (v["event"] != "step" || v["step"].as_u64() < Some(4)).then_some(v));
    });
    assert!(close(cut, whole) && partial == 2, "{cut} against {whole}");

    let (whole, power, per_token, _) = figures("solo", 1, &|_| {});
    let (power, per_token) = (power.unwrap(), per_token.unwrap());
    let (lost, lost_power, lost_per_token, _) = figures("lost", 1, &|d| drop_step(d, 0, 4));
    assert!(close(lost, whole), "{lost} against {whole}");
    assert!(close(lost_power.unwrap(), power), "{lost_power:?} W against {power} W");
    assert!(close(lost_per_token.unwrap(), per_token), "{lost_per_token:?} J/token against {per_token}");
    let (twice, _, _, _) = figures("twice", 1, &|d| {
        let log = d.join("rank0.jsonl");
        let text = fs::read_to_string(&log).unwrap();
        fs::write(&log, format!("{text}{text}")).unwrap();
    });
    assert!(close(twice, whole), "{twice} against {whole}");
}

/// A garbage `rank1.jsonl` beside a one-rank run is one problem, that it has no start record: no
/// second one saying its start record disagrees (it has none). Two runs in one folder, each short
/// of a rank: each missing-ranks problem names its run.
#[test]
fn a_file_without_a_start_is_one_problem_and_missing_ranks_name_their_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("solo");
    run("solo", ModelPreset::Gpt2, ZeroStage::Z1, 4, 1, 50.0).write(&dir).unwrap();
    fs::write(dir.join("rank1.jsonl"), "garbage\n").unwrap();
    let got = read(tmp.path());
    let about: Vec<String> =
        got.problems.iter().filter(|p| p.path.ends_with("rank1.jsonl")).map(|p| p.kind.to_string()).collect();
    assert_eq!(about, ["no start record found; the file's rank and run are unknown"]);

    let tmp = tempfile::tempdir().unwrap();
    let mix = tmp.path().join("mix");
    run("a", ModelPreset::Gpt2, ZeroStage::Z1, 4, 2, 50.0).write_ranks(&mix, [0]).unwrap();
    let b = run("b", ModelPreset::Gpt2, ZeroStage::Z2, 4, 2, 50.0);
    let sub = tmp.path().join("b");
    b.write_ranks(&sub, [1]).unwrap();
    fs::rename(sub.join("rank1.jsonl"), mix.join("rank1.jsonl")).unwrap();
    let missing: Vec<String> = read(tmp.path())
        .problems
        .iter()
        .filter(|p| matches!(p.kind, ProblemKind::MissingRanks { .. }))
        .map(|p| p.kind.to_string())
        .collect();
    assert_eq!(
        missing,
        ["1 of 2 rank logs of run a missing (ranks 1)", "1 of 2 rank logs of run b missing (ranks 0)"],
        "{missing:#?}"
    );
}

/// A rank log appended to itself (or a run restarted into its old log) holds each measured step
/// twice: reported with its file, the records and the steps, and the run's figures stay those of
/// the log read once.
#[test]
fn steps_logged_twice_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let once = read(tmp.path()).runs[0].row.clone();
    let log = dir.join("rank1.jsonl");
    let text = fs::read_to_string(&log).unwrap();
    fs::write(&log, format!("{text}{text}")).unwrap();
    let got = read(tmp.path());
    let repeated: Vec<&Problem> =
        got.problems.iter().filter(|p| matches!(p.kind, ProblemKind::RepeatedSteps { .. })).collect();
    assert_eq!(repeated.len(), 1, "{:#?}", got.problems);
    assert_eq!(repeated[0].path, log);
    assert_eq!(repeated[0].kind, ProblemKind::RepeatedSteps { records: 8, steps: 4, first: 2, last: 5 });
    let twice = &got.runs[0].row;
    assert_eq!((twice.steps_measured, twice.step_ms_median), (once.steps_measured, once.step_ms_median));
    assert!((twice.tokens_per_s.unwrap() / once.tokens_per_s.unwrap() - 1.0).abs() < 0.1);
}

/// A last loss that was not finite (`null` in the log) is no final loss, not the last finite one,
/// and no problem; an energy counter beyond what a number holds gives no energy figures, not
/// `inf` in the tables.
#[test]
fn losses_and_counters_that_are_not_finite_give_no_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_ranks(&dir, |mut v| {
        if is_step(&v, 5) {
            v["loss"] = serde_json::Value::Null;
            v["energy_j"] = serde_json::json!(1e308);
        }
        if is_step(&v, 2) {
            v["energy_j"] = serde_json::json!(-1e308);
        }
        Some(v)
    });
    let got = read(tmp.path());
    assert!(got.problems.is_empty(), "{:#?}", got.problems);
    let row = &got.runs[0].row;
    assert_eq!((row.status, row.steps_measured), (Status::Ok, 4));
    assert_eq!((row.final_loss, row.energy_j_per_token, row.avg_power_w_per_gpu), (None, None, None));
}

/// A second `start` record in a rank log (a run restarted into its old log, or another run's log
/// appended to it) is reported at its line, naming the other run where its id differs; the file's
/// own start is not, even below a broken first line. The same however the files are cut into
/// ranges, and the line is no bad line: the records after it are read.
#[test]
fn a_second_start_record_is_reported_at_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let (log0, log1) = (dir.join("rank0.jsonl"), dir.join("rank1.jsonl"));
    let text0 = fs::read_to_string(&log0).unwrap();
    let text1 = fs::read_to_string(&log1).unwrap();
    // start, setup, 6 steps and end.
    assert_eq!(text0.lines().count(), 9);
    // Rank 0 restarted into its own log, below a broken first line: its second start is line 11.
    fs::write(&log0, format!("garbage\n{text0}{text0}")).unwrap();
    // Another run's rank 1 log appended to rank 1's: its start is line 10.
    let elsewhere = tempfile::tempdir().unwrap();
    let mut other = run("q", ModelPreset::Gpt2, ZeroStage::Z1, 4, 2, 50.0);
    other.seed = 9;
    other.write_ranks(elsewhere.path(), [1]).unwrap();
    let text_q = fs::read_to_string(elsewhere.path().join("rank1.jsonl")).unwrap();
    fs::write(&log1, format!("{text1}{text_q}")).unwrap();

    let got = read(tmp.path());
    let starts: Vec<(String, Option<u64>, ProblemKind)> = got
        .problems
        .iter()
        .filter(|p| matches!(p.kind, ProblemKind::AnotherStart { .. }))
        .map(|p| (p.path.file_name().unwrap().to_string_lossy().into_owned(), p.line, p.kind.clone()))
        .collect();
    assert_eq!(
        starts,
        [
            ("rank0.jsonl".into(), Some(11), ProblemKind::AnotherStart { other_run: None }),
            ("rank1.jsonl".into(), Some(10), ProblemKind::AnotherStart { other_run: Some("q".into()) }),
        ],
        "{:#?}",
        got.problems
    );
    let text = |name: &str| {
        got.problems.iter().find(|p| p.path.ends_with(name) && p.line.is_some_and(|l| l > 1)).unwrap().to_string()
    };
    assert!(
        text("rank1.jsonl").ends_with(
            "rank1.jsonl:10: another start record (run q): a run restarted into this log, or another run's log \
             appended; its records are read as this run's"
        ),
        "{}",
        text("rank1.jsonl")
    );
    assert!(
        text("rank0.jsonl").ends_with(
            "rank0.jsonl:11: another start record: a run restarted into this log, or another run's log appended; \
             its records are read as this run's"
        ),
        "{}",
        text("rank0.jsonl")
    );
    // The broken first line is the only bad line; the records after the starts are read.
    assert!(got.problems.iter().any(|p| p.path == log0 && p.line == Some(1)), "{:#?}", got.problems);
    assert_eq!(got.stats.bad_lines, 1);
    assert_eq!(got.runs.len(), 1);
    assert_eq!(got.runs[0].row.status, Status::Ok);
    assert_eq!(got.problems.iter().filter(|p| matches!(p.kind, ProblemKind::RepeatedSteps { .. })).count(), 2);
    // Cut into ranges of every size, down to a byte: the same problems.
    for chunk_bytes in [1, 7, 100, 1000, 5000] {
        let cut = read_with(tmp.path(), &Options { chunk_bytes, ..Options::default() });
        assert_eq!(cut.problems, got.problems, "ranges of {chunk_bytes} bytes");
        assert_eq!(cut.stats, got.stats, "ranges of {chunk_bytes} bytes");
    }
}

/// A log restarted into many times lists its first start records after its own like any other
/// problems, and counts the rest, however the file is cut.
#[test]
fn many_start_records_are_listed_then_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let log = dir.join("rank1.jsonl");
    let text = fs::read_to_string(&log).unwrap();
    fs::write(&log, text.repeat(25)).unwrap();
    for chunk_bytes in [1, 1000, 32 << 20] {
        let got = read_with(tmp.path(), &Options { chunk_bytes, ..Options::default() });
        let listed: Vec<(Option<u64>, ProblemKind)> = got
            .problems
            .iter()
            .filter(|p| p.path == log && !matches!(p.kind, ProblemKind::RepeatedSteps { .. }))
            .map(|p| (p.line, p.kind.clone()))
            .collect();
        let mut want: Vec<(Option<u64>, ProblemKind)> =
            (1..=20).map(|i| (Some(9 * i + 1), ProblemKind::AnotherStart { other_run: None })).collect();
        want.push((None, ProblemKind::More { count: 4 }));
        assert_eq!(listed, want, "ranges of {chunk_bytes} bytes");
        assert_eq!(got.stats.bad_lines, 0, "ranges of {chunk_bytes} bytes");
    }
}

/// A step one rank logged twice with one step time but other phases (a duplicated step): the
/// step's phases are one record's, the same whichever copy comes first in the log.
#[test]
fn a_step_logged_twice_with_one_time_reads_the_same_in_either_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let log = dir.join("rank1.jsonl");
    let text = fs::read_to_string(&log).unwrap();
    let mut lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let at = lines.iter().position(|v| is_step(v, 3)).unwrap();
    // Rank 1 the slowest at step 3, with one step time twice and the time moved between phases.
    lines[at]["step_ms"] = serde_json::json!(1000.0);
    let mut copy = lines[at].clone();
    copy["forward_ms"] = serde_json::json!(copy["forward_ms"].as_f64().unwrap() + 100.0);
    copy["backward_ms"] = serde_json::json!(copy["backward_ms"].as_f64().unwrap() + 200.0);
    let rows: Vec<_> = [at, at + 1]
        .into_iter()
        .map(|i| {
            let mut l = lines.clone();
            l.insert(i, copy.clone());
            let out: String = l.iter().map(|v| format!("{}\n", serde_json::to_string(v).unwrap())).collect();
            fs::write(&log, out).unwrap();
            let got = read(tmp.path());
            assert_eq!(got.runs.len(), 1);
            got.runs[0].row.clone()
        })
        .collect();
    assert_eq!(rows[0], rows[1]);
}

/// Model-state byte counts as large as they go (a hostile setup record) add up to `u64::MAX`,
/// not wrapped round to a few bytes.
#[test]
fn model_states_beyond_what_a_count_holds_saturate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    edit_ranks(&dir, |mut v| {
        if v["event"] == "setup" {
            v["model_state"] = serde_json::json!({"params_bytes": u64::MAX, "grads_bytes": 2, "optimizer_bytes": 2});
        }
        Some(v)
    });
    let got = read(tmp.path());
    let row = &got.runs[0].row;
    assert_eq!(row.state_params_bytes, Some(u64::MAX));
    assert_eq!(row.state_bytes(), Some(u64::MAX));
}

/// Every rank ended `ok`, yet the run is short of its steps: an `end` counting fewer steps than
/// configured (the worker ends `ok` only after the last), or steps no rank's record was read for
/// (lines lost from every log). Incomplete, saying why, not a complete run of fewer steps.
#[test]
fn an_ok_end_short_of_the_steps_is_incomplete() {
    let status = |edit: &dyn Fn(serde_json::Value) -> Option<serde_json::Value>| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = one_run(tmp.path(), "r");
        edit_ranks(&dir, edit);
        let got = read(tmp.path());
        (got.runs[0].row.status, got.runs[0].row.status_detail.clone().unwrap_or_default())
    };
    assert_eq!(status(&Some).0, Status::Ok);
    let (st, why) = status(&|mut v| {
        if v["event"] == "end" {
            v["steps_completed"] = serde_json::json!(4);
        }
        Some(v)
    });
    assert_eq!(st, Status::Incomplete);
    assert!(why.contains("ended ok after 4 of 6 steps"), "{why}");
    let (st, why) = status(&|v| (!(is_step(&v, 4) || is_step(&v, 5))).then_some(v));
    assert_eq!(st, Status::Incomplete);
    assert_eq!(why, "2 of 6 steps have no record on any rank");
}

/// `--warmup` at or past a run's configured steps leaves it no measured step: said, not a
/// complete result without a time figure.
#[test]
fn a_warmup_past_the_steps_is_a_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = one_run(tmp.path(), "r");
    let got = read_with(tmp.path(), &Options { warmup: Some(6), ..Options::default() });
    assert_eq!(got.runs[0].row.steps_measured, 0);
    let kinds: Vec<&ProblemKind> = got.problems.iter().map(|p| &p.kind).collect();
    assert_eq!(kinds, [&ProblemKind::NothingMeasured { warmup: 6, steps: 6 }]);
    assert_eq!(got.problems[0].path, dir);
    assert!(read_with(tmp.path(), &Options { warmup: Some(5), ..Options::default() }).problems.is_empty());
}

/// A log saved with a UTF-8 byte-order mark is read as written without one; a compressed log is
/// named, not passed over in silence (its run would be lost with no word).
#[test]
fn byte_order_marks_are_read_and_compressed_logs_named() {
    let tmp = tempfile::tempdir().unwrap();
    let marked = one_run(tmp.path(), "marked");
    let before = read(tmp.path());
    for rank in ["rank0.jsonl", "rank1.jsonl"] {
        let text = fs::read(marked.join(rank)).unwrap();
        fs::write(marked.join(rank), [b"\xEF\xBB\xBF".as_slice(), &text].concat()).unwrap();
    }
    let after = read(tmp.path());
    assert!(after.complete(), "{:?}", after.problems);
    assert_eq!(after.runs[0].row, before.runs[0].row);
    assert_eq!(after.runs[0].row.status, Status::Ok);

    let zipped = one_run(tmp.path(), "zipped");
    for rank in ["rank0.jsonl", "rank1.jsonl"] {
        fs::rename(zipped.join(rank), zipped.join(format!("{rank}.gz"))).unwrap();
    }
    fs::write(zipped.join("slurm-7.out.zst"), b"\x28\xb5\x2f\xfd").unwrap();
    fs::write(zipped.join("notes.txt.gz.bak"), b"").unwrap();
    let got = read(tmp.path());
    let ids: Vec<&str> = got.runs.iter().map(|r| r.row.run_id.as_str()).collect();
    assert_eq!(ids, ["marked"]);
    let named: Vec<(String, String)> = got
        .problems
        .iter()
        .map(|p| (p.path.file_name().unwrap().to_string_lossy().into_owned(), p.kind.to_string()))
        .collect();
    let says = |inner: &str| format!("compressed log, not read: decompress it to {inner} and ingest again");
    assert_eq!(
        named,
        [
            ("rank0.jsonl.gz".to_string(), says("rank0.jsonl")),
            ("rank1.jsonl.gz".to_string(), says("rank1.jsonl")),
            ("slurm-7.out.zst".to_string(), says("slurm-7.out")),
        ]
    );
    assert!(!got.complete());
}
