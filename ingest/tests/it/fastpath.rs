//! The fast step-line scanner against the schema's parser: it reads every line the worker writes,
//! and whatever it accepts, the schema accepts with the same values. Also a fuzzed log through the
//! whole reader.

use std::collections::BTreeMap;

use proptest::prelude::*;
use zerobench_ingest::fastpath::parse_step;
use zerobench_ingest::record::StepLine;
use zerobench_ingest::{NoProgress, Options};
use zerobench_schema::log::{parse_line, CommStats, MemorySample, Record, Step, SCHEMA_VERSION};

fn real() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), 0.0f64..1e4, 1e-200f64..1e200, (0u32..1_000_000).prop_map(f64::from)]
}

fn comm() -> impl Strategy<Value = BTreeMap<String, CommStats>> {
    // Kinds of the world and of the hpZ group, copies, and one the schema does not name.
    let kind = prop_oneof![
        Just("all_reduce"),
        Just("reduce_scatter"),
        Just("all_gather"),
        Just("broadcast"),
        Just("d2h"),
        Just("h2d"),
        Just("all_gather_group"),
        Just("p2p")
    ];
    let stats = (any::<u32>(), any::<u64>(), real(), any::<u64>(), proptest::option::of(real())).prop_map(
        |(calls, bytes, ms, max_bytes, bus_gbps)| CommStats { calls: u64::from(calls), bytes, ms, max_bytes, bus_gbps },
    );
    proptest::collection::btree_map(kind.prop_map(String::from), stats, 0..4)
}

fn memory() -> impl Strategy<Value = MemorySample> {
    let o = || proptest::option::of(0u64..(1 << 50));
    (o(), o(), o(), o(), o(), o(), o(), 0u64..(1 << 40)).prop_map(|(a, pa, r, pr, retries, ooms, nvml, rss)| {
        MemorySample {
            allocated_bytes: a,
            peak_allocated_bytes: pa,
            reserved_bytes: r,
            peak_reserved_bytes: pr,
            alloc_retries: retries,
            ooms,
            nvml_used_bytes: nvml,
            rss_bytes: rss,
        }
    })
}

fn step() -> impl Strategy<Value = Step> {
    let ids = (any::<u32>(), any::<u32>(), any::<bool>(), any::<bool>(), 0u64..(1 << 40), 0u64..(1 << 30));
    let times = (real(), real(), real(), real(), real(), real(), real(), real());
    let opts = (
        proptest::option::of(real()),
        proptest::option::of(real()),
        proptest::option::of(real()),
        proptest::option::of(0u32..101),
    );
    (ids, times, opts, comm(), memory()).prop_map(
        |((rank, step, warmup, skipped, tokens, samples), t, o, comm, memory)| Step {
            v: SCHEMA_VERSION,
            ts: t.7,
            rank,
            step,
            warmup,
            // A loss that was not finite is written `null`: every seventh step here.
            loss: Some(t.6).filter(|_| step % 7 != 0),
            skipped,
            loss_scale: o.0,
            tokens,
            samples,
            step_ms: t.0,
            forward_ms: t.1,
            backward_ms: t.2,
            optimizer_ms: t.3,
            comm_ms: t.4,
            exposed_comm_ms: t.5,
            other_ms: t.5,
            overhead_ms: t.4,
            comm,
            memory,
            power_w: o.1,
            energy_j: o.2,
            gpu_util_pct: o.3,
        },
    )
}

fn same_f64(a: f64, b: f64) -> bool {
    // serde_json's default float parser may be one unit in the last place off; ours is exact.
    a == b || (a - b).abs() <= 4.0 * f64::EPSILON * a.abs().max(b.abs())
}

fn assert_same(fast: &StepLine<'_>, slow: &StepLine<'_>) {
    assert_eq!(
        (fast.rank, fast.step, fast.skipped, fast.tokens, fast.samples),
        (slow.rank, slow.step, slow.skipped, slow.tokens, slow.samples)
    );
    assert_eq!(fast.loss.is_some(), slow.loss.is_some());
    if let (Some(a), Some(b)) = (fast.loss, slow.loss) {
        assert!(same_f64(a, b), "{a} vs {b}");
    }
    for (a, b) in [
        (fast.step_ms, slow.step_ms),
        (fast.forward_ms, slow.forward_ms),
        (fast.backward_ms, slow.backward_ms),
        (fast.optimizer_ms, slow.optimizer_ms),
        (fast.comm_ms, slow.comm_ms),
        (fast.exposed_comm_ms, slow.exposed_comm_ms),
    ] {
        assert!(same_f64(a, b), "{a} vs {b}");
    }
    assert_eq!(fast.energy_j.is_some(), slow.energy_j.is_some());
    if let (Some(a), Some(b)) = (fast.energy_j, slow.energy_j) {
        assert!(same_f64(a, b));
    }
    assert_eq!(fast.memory, slow.memory);
    let f: Vec<_> = fast.comm.iter().collect();
    let s: Vec<_> = slow.comm.iter().collect();
    assert_eq!(f.len(), s.len());
    for ((kf, cf), (ks, cs)) in f.iter().zip(&s) {
        assert_eq!((kf, cf.calls, cf.bytes), (ks, cs.calls, cs.bytes));
        assert!(same_f64(cf.ms, cs.ms));
    }
}

/// A seeded mutation of a line: flip, delete or insert a byte, cut it, add whitespace, or
/// duplicate a stretch.
fn mutate(line: &mut Vec<u8>, op: u8, pos: usize, byte: u8) {
    if line.is_empty() {
        return;
    }
    let p = pos % line.len();
    match op % 7 {
        0 => line[p] = byte,
        1 => {
            line.remove(p);
        }
        2 => line.insert(p, byte),
        3 => line.truncate(p),
        4 => line.insert(p, b' '),
        5 => {
            let piece: Vec<u8> = line[p..(p + 12).min(line.len())].to_vec();
            line.splice(p..p, piece);
        }
        _ => line[p] = b"0123456789.-eE+\"{}:,"[usize::from(byte) % 20],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn fast_path_agrees_with_serde(s in step(), mutation in proptest::option::of((any::<u8>(), any::<usize>(), any::<u8>()))) {
        let mut line = serde_json::to_vec(&Record::Step(s)).unwrap();
        if let Some((op, pos, byte)) = mutation {
            mutate(&mut line, op, pos, byte);
        }
        let slow = parse_line(&line);
        match parse_step(&line) {
            Some(fast) => {
                let refused = |why: String| TestCaseError::fail(format!("fast path accepted what the schema refuses ({why}): {}", String::from_utf8_lossy(&line)));
                let step = match slow {
                    Ok(Record::Step(s)) => s,
                    Ok(other) => return Err(refused(format!("a {} record", other.event()))),
                    Err(e) => return Err(refused(e.to_string())),
                };
                assert_same(&fast, &StepLine::from(&step));
            }
            None => prop_assert!(mutation.is_some(), "fast path refused a writer line: {}", String::from_utf8_lossy(&line)),
        }
    }
}

/// Names the schema does not define come out in the schema map's order, whatever their order in
/// the line (found by the property above in CI: `p2p` before a mutated `3educe_scatter`).
#[test]
fn unknown_kinds_come_out_sorted() {
    let comm = r#""comm":{"p2p":{"calls":1,"bytes":2,"ms":3.0,"max_bytes":2},"3educe_scatter":{"calls":4,"bytes":5,"ms":6.0,"max_bytes":5}}"#;
    let line = format!(
        r#"{{"event":"step","v":{SCHEMA_VERSION},"ts":1.0,"rank":0,"step":1,"warmup":false,"loss":1.0,"skipped":false,"tokens":8,"samples":1,"step_ms":9.0,"forward_ms":1.0,"backward_ms":1.0,"optimizer_ms":1.0,"comm_ms":9.0,"exposed_comm_ms":0.0,{comm},"memory":{{"rss_bytes":1}}}}"#
    );
    let fast = parse_step(line.as_bytes()).expect("a well-formed step line");
    let Ok(Record::Step(step)) = parse_line(line.as_bytes()) else { panic!("the schema refuses {line}") };
    let names: Vec<&str> = fast.comm.iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["3educe_scatter", "p2p"]);
    assert_same(&fast, &StepLine::from(&step));
}

/// A log of mutated lines through the whole reader: nothing panics, every line is counted.
/// `ZEROBENCH_FUZZ_LINES` sets the number of lines (20 000 by default; 1 000 000 for the
/// reliability figures of docs/testing.md).
#[test]
fn a_fuzzed_log_never_panics() {
    let n: usize = std::env::var("ZEROBENCH_FUZZ_LINES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let tmp = tempfile::tempdir().unwrap();
    let r =
        crate::common::run("fuzz", zerobench_schema::ModelPreset::Gpt2, zerobench_schema::ZeroStage::Z3, 4, 1, 50.0);
    let records: Vec<Vec<u8>> = r.records(0).iter().map(|x| serde_json::to_vec(x).unwrap()).collect();
    let mut out = records[0].clone();
    out.push(b'\n');
    let mut rng = zerobench_schema::splitmix::SplitMix64(0x2545_F491_4F6C_DD1D);
    let mut next = || rng.next_u64();
    for _ in 0..n {
        let mut line = records[(next() as usize) % records.len()].clone();
        for _ in 0..=(next() % 4) {
            let x = next();
            mutate(&mut line, x as u8, (x >> 8) as usize, (x >> 40) as u8);
        }
        line.retain(|b| *b != b'\n');
        out.extend_from_slice(&line);
        out.push(b'\n');
    }
    std::fs::write(tmp.path().join("rank0.jsonl"), out).unwrap();
    let got = zerobench_ingest::ingest(
        &[tmp.path().to_path_buf()],
        &Options { chunk_bytes: 1 << 16, ..Options::default() },
        &NoProgress,
    );
    assert_eq!(got.stats.lines, n as u64 + 1);
    assert!(got.stats.bad_lines > 0 && got.stats.bad_lines <= n as u64);
    assert_eq!(got.runs.len(), 1);
}
