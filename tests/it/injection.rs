//! Hostile strings in every user-controlled field are rendered and the scripts run under bash,
//! with `srun`, `mpirun`, `mpiexec`, `pdsh`, `scontrol`, `module` and the worker replaced by stubs
//! on `PATH` that record the arguments and environment they get. Nothing from the strings may run
//! (each would create a marker file), and every value must arrive exactly as written.
//!
//! Fields with a strict grammar (Slurm names, time, hostnames, hostlists, env names, filters)
//! refuse hostile values when the spec loads; that is checked too.

use std::path::Path;
use std::process::Command;

use zerobench_launcher::render::{read_record, render};
use zerobench_launcher::{Plan, Spec};

use crate::support::write_script;

/// Each one would touch `pwned` in the current folder if a shell ran it.
const HOSTILE: &[&str] = &[
    "$(touch pwned)",
    "`touch pwned`",
    "'; touch pwned; '",
    "\"; touch pwned; \"",
    "x\ntouch pwned\n",
    "a b; touch pwned #",
    "${IFS}$(touch${IFS}pwned)",
    "\\'$(touch pwned)\\'",
    "%n %h $((1)) * ~ ! & | < > ( ) { } [ ]",
];

/// The data path: a command substitution and line breaks (a wrapped, indented script line once
/// changed such a path under pdsh).
const DATA: &str = "$(touch pwned)\ntouch pwned\n";

/// A stub that writes its argv (NUL-separated) to `$STUB_DIR/<name>.<pid>` and, for the
/// launchers, runs what it was asked to run the way the real one would.
fn stub(dir: &Path, name: &str, body: &str) {
    write_script(&dir.join(name), &format!("printf '%s\\0' \"$@\" > \"$STUB_DIR/{name}.$$\"\n{body}"));
}

fn stubs(dir: &Path) {
    // srun/mpirun/mpiexec: skip their own options, run the program once as rank 0.
    let launcher = "while [ $# -gt 0 ]; do case $1 in -x|-np|-n|-ppn|--map-by|--bind-to|--hostfile|-f|-genvlist) shift 2;; --mca) shift 3;; -*) shift;; *) break;; esac; done\nexec \"$@\"";
    stub(dir, "srun", launcher);
    stub(dir, "mpirun", launcher);
    stub(dir, "mpiexec", launcher);
    // pdsh -R exec style: run the command once per host, with %% turned into % and %n into
    // the host's index (the node rank), as pdsh does.
    stub(
        dir,
        "pdsh",
        r#"hosts=; while [ $# -gt 0 ]; do case $1 in -w) hosts=$2; shift 2;; -R|-f) shift 2;; -*) shift;; *) break;; esac; done
IFS=, read -r -a host_list <<<"$hosts"
for ((i = 0; i < ${#host_list[@]}; i++)); do
  args=()
  for a in "$@"; do a=${a//"%%"/$'\x01'}; a=${a//"%n"/$i}; args+=("${a//$'\x01'/%}"); done
  "${args[@]}" || exit $?
done"#,
    );
    stub(dir, "module", "");
    // The torchrun method's wrapper names the first host of the step.
    stub(dir, "scontrol", "echo node-a");
    // The worker: also records the environment the spec exports.
    stub(dir, "zerobench-worker", "env | grep '^HOSTILE_' | sort > \"$STUB_DIR/worker-env.$$\"");
}

fn argv_files(dir: &Path, prefix: &str) -> Vec<Vec<String>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{prefix}.")))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let b = std::fs::read(p).unwrap();
            b.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
        })
        .collect()
}

fn yaml(s: &str) -> String {
    serde_json::to_string(s).unwrap() // a JSON string is a YAML double-quoted scalar
}

#[test]
fn hostile_values_are_rendered_inert_for_every_method() {
    let base = tempfile::tempdir().unwrap();
    // The output folder itself is hostile (newlines are refused for #SBATCH lines; see below).
    let out = base.path().join("o u t'$(touch pwned)\"`touch pwned`;%n");
    let bin = base.path().join("bin");
    let stub_dir = base.path().join("calls");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&stub_dir).unwrap();
    stubs(&bin);
    let hf = base.path().join("hosts");
    std::fs::write(&hf, "node-a slots=2\nnode-b slots=2\n").unwrap();

    // A module name with a line break is refused at plan time (`module load` cannot take it;
    // `launcher` spec tests); the other hostile strings must render inert.
    let modules: Vec<String> = HOSTILE.iter().filter(|h| !h.contains('\n')).map(|h| yaml(h)).collect();
    let env: Vec<String> = HOSTILE.iter().enumerate().map(|(i, h)| format!("    HOSTILE_{i}: {}", yaml(h))).collect();
    for (method, extra) in
        [("srun", ""), ("mpirun", ""), ("local", ""), ("pdsh", "  pdsh_rcmd: exec\n"), ("torchrun", "")]
    {
        let nodes = if method == "local" { 1 } else { 2 };
        let hostfile =
            if method == "pdsh" { format!("  hostfile: {}\n", yaml(hf.to_str().unwrap())) } else { String::new() };
        let text = format!(
            "cluster:\n  modules: [{}]\n  env:\n{}\n{hostfile}launch:\n  method: {method}\n{extra}worker:\n  data: {}\nsweep:\n  models: tiny\n  stages: 1\n  nodes: {nodes}\n  ranks_per_node: 2\n",
            modules.join(", "),
            env.join("\n"),
            yaml(DATA),
        );
        let spec_path = base.path().join(format!("{method}.yaml"));
        std::fs::write(&spec_path, &text).unwrap();
        // The data file must exist (relative to the spec): one with the hostile name.
        std::fs::write(base.path().join(DATA), "text").unwrap();
        let plan = Plan::build(Spec::load(&spec_path).unwrap_or_else(|e| panic!("{method}: {e}"))).unwrap();
        let dirs = render(&plan, &out.join(method)).unwrap();
        let run = &dirs[0];
        let rec = read_record(run).unwrap();

        let cwd = base.path().join(format!("cwd-{method}"));
        std::fs::create_dir_all(&cwd).unwrap();
        let calls = stub_dir.join(method);
        std::fs::create_dir_all(&calls).unwrap();
        let o = Command::new("bash")
            .arg(run.join("job.sbatch"))
            .current_dir(&cwd)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("STUB_DIR", &calls)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{method}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );

        // Nothing ran: no marker anywhere we can see.
        for d in [&cwd, base.path(), run, &out] {
            assert!(!d.join("pwned").exists(), "{method}: a hostile string ran in {}", d.display());
        }
        // Every module name arrived as one argument, verbatim.
        let module_calls = argv_files(&calls, "module");
        let got: Vec<&str> = module_calls.iter().map(|a| a[1].as_str()).collect();
        // job.sbatch loads them; with pdsh, node.sh loads them again on each of the 2 hosts.
        let loads = if method == "pdsh" { 3 } else { 1 };
        let one_line = HOSTILE.iter().filter(|h| !h.contains('\n'));
        assert_eq!(module_calls.len(), loads * one_line.clone().count(), "{method}: {module_calls:?}");
        assert!(module_calls.iter().all(|a| a.len() == 2 && a[0] == "load"), "{method}: {module_calls:?}");
        for h in one_line {
            assert!(got.contains(h), "{method}: module {h:?} not passed verbatim: {got:?}");
        }
        // The launcher got exactly the argv that run.json records (the root guard aside).
        let launcher = rec.launch_argv[0].clone();
        let mut launched =
            argv_files(&calls, &launcher).pop().unwrap_or_else(|| panic!("{method}: {launcher} not called"));
        launched.retain(|a| a != "--allow-run-as-root");
        assert_eq!(launched, rec.launch_argv[1..], "{method}");
        // The worker got its argv verbatim (the hostile data path included), and the env values.
        let worker_calls = argv_files(&calls, "zerobench-worker");
        assert!(!worker_calls.is_empty(), "{method}: worker not started");
        for w in &worker_calls {
            assert_eq!(w[..], rec.worker_argv[1..], "{method}");
        }
        let env_file = std::fs::read_dir(&calls)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains("worker-env."))
            .unwrap();
        let env_text = std::fs::read_to_string(env_file).unwrap();
        for (i, h) in HOSTILE.iter().enumerate().filter(|(_, h)| !h.contains('\n')) {
            assert!(
                env_text.contains(&format!("HOSTILE_{i}={h}\n")),
                "{method}: HOSTILE_{i} not exported verbatim:\n{env_text}"
            );
        }
    }
}

#[test]
fn strict_fields_refuse_hostile_values() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hosts");
    std::fs::write(&hf, "node-a slots=2\n").unwrap();
    let hf = yaml(hf.to_str().unwrap());
    for h in HOSTILE {
        let v = yaml(h);
        for field in [
            format!("cluster:\n  partition: {v}\n"),
            format!("cluster:\n  account: {v}\n"),
            format!("cluster:\n  qos: {v}\n"),
            format!("cluster:\n  time: {v}\n"),
            format!("cluster:\n  nodelist: {v}\n"),
            format!("cluster:\n  env: {{{v}: x}}\n"),
            format!("cluster:\n  hostfile: {hf}\n  include: {v}\n"),
            format!("cluster:\n  hostfile: {hf}\n  exclude: {v}\n"),
            format!("launch:\n  mpi: {v}\n"),
        ] {
            let text = format!("{field}sweep:\n  models: tiny\n");
            assert!(Spec::parse(&text, Path::new("s.yaml")).is_err(), "accepted:\n{text}");
        }
        let bad_host = dir.path().join("bad-hosts");
        std::fs::write(&bad_host, format!("{} slots=1\n", h.replace('\n', " "))).unwrap();
        let text = format!(
            "cluster:\n  hostfile: {}\nlaunch:\n  method: pdsh\nsweep:\n  models: tiny\n",
            yaml(bad_host.to_str().unwrap())
        );
        assert!(Spec::parse(&text, Path::new("s.yaml")).is_err(), "accepted host {h:?}");
    }
}

#[test]
fn an_output_folder_sbatch_cannot_hold_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("s.yaml");
    std::fs::write(&spec, "sweep:\n  models: tiny\n  stages: 0\n").unwrap();
    let plan = Plan::build(Spec::load(&spec).unwrap()).unwrap();
    for bad in ["line\nbreak", "back\\slash"] {
        let e = render(&plan, &dir.path().join(bad)).unwrap_err().to_string();
        assert!(e.contains("cannot be written into an #SBATCH line"), "{e}");
    }
}
