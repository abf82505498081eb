//! Golden tests: every table, in every text format, of the fixed log set in `common::golden_set`,
//! compared with the reviewed snapshots in `snapshots/`. A change in any figure, column or cell
//! fails here; review it with `cargo insta review` (or INSTA_UPDATE=always) when intended.

use zerobench_ingest::report::{self, terminal, Format};
use zerobench_ingest::tables::Tables;

use crate::common::{golden_set, read, redact};

#[test]
fn every_table_of_the_fixture_set() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    golden_set(&root);
    let ingested = read(&root);
    let tables = Tables::build(&ingested.runs);

    for t in tables.text_tables() {
        insta::assert_snapshot!(format!("{}.md", t.name), redact(&zerobench_table::markdown(&t), &root));
    }
    let problems: Vec<String> = ingested.problems.iter().map(|p| redact(&p.to_string(), &root)).collect();
    insta::assert_snapshot!("problems", problems.join("\n"));
    let mut summary = Vec::new();
    zerobench_table::write_text(&mut summary, &terminal::summary_table(&tables.runs)).unwrap();
    insta::assert_snapshot!("terminal", redact(&String::from_utf8(summary).unwrap(), &root));

    // The files: every format is written, CSV and Markdown carry the same cells, JSON parses.
    let out = tmp.path().join("out");
    let (written, failed) =
        report::write_all(&ingested, &tables, &out, &Format::ALL, report::Replace::IngestOwn).unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    for name in ["latency", "mem", "scaling", "comm", "runs"] {
        for ext in ["csv", "md", "json"] {
            assert!(out.join(format!("{name}.{ext}")).is_file(), "{name}.{ext}");
        }
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(format!("{name}.json"))).unwrap()).unwrap();
        assert_eq!(json["schema_version"], 1);
    }
    // Without a cost model there are no predictions, and no empty table of them.
    for ext in ["csv", "md", "json"] {
        assert!(!out.join(format!("predicted.{ext}")).exists(), "predicted.{ext}");
    }
    let latency_csv = std::fs::read_to_string(out.join("latency.csv")).unwrap();
    insta::assert_snapshot!("latency.csv", latency_csv);
    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["complete"], false);
    assert_eq!(summary["problems"].as_array().unwrap().len(), ingested.problems.len());
    for svg in ["step-breakdown.svg", "throughput-gpt2-medium.svg", "memory-gpt2-mbs4.svg"] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(text.starts_with("<svg") && text.contains("</svg>"), "{svg}");
        assert!(written.contains(&out.join(svg)));
    }
    let mem_json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("mem.json")).unwrap()).unwrap();
    insta::assert_json_snapshot!("mem.json", redact_json(mem_json, &root));
}

fn redact_json(v: serde_json::Value, root: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&redact(&v.to_string(), root)).unwrap()
}

/// Progress is told the bytes to read once, before reading, and is then advanced by exactly
/// that many: worker logs and foreign logs alike.
#[test]
fn progress_adds_up_to_the_bytes_announced() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use zerobench_ingest::{ingest, Options, Progress};
    #[derive(Default)]
    struct Count {
        total: AtomicU64,
        starts: AtomicU64,
        done: AtomicU64,
    }
    impl Progress for Count {
        fn start(&self, total_bytes: u64) {
            self.total.store(total_bytes, Ordering::SeqCst);
            self.starts.fetch_add(1, Ordering::SeqCst);
        }
        fn advance(&self, bytes: u64) {
            self.done.fetch_add(bytes, Ordering::SeqCst);
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("logs");
    golden_set(&root);
    let count = Count::default();
    let got = ingest(&[root], &Options::default(), &count);
    let (total, done) = (count.total.load(Ordering::SeqCst), count.done.load(Ordering::SeqCst));
    assert_eq!(count.starts.load(Ordering::SeqCst), 1);
    assert_eq!(total, done);
    // Every byte read is announced, of both kinds of log.
    assert!(got.runs.iter().any(|r| r.row.source == zerobench_ingest::Source::Foreign));
    assert_eq!(total, got.stats.bytes);
}
