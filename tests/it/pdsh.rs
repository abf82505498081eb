//! The pdsh method with the real pdsh, `-R exec` standing in for ssh (every "host" runs here):
//! node ranks from `%n`, the rank environment node.sh sets, and a failing rank failing the job
//! instead of leaving the others running.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use zerobench_launcher::render::render;
use zerobench_launcher::{Plan, Spec};

use crate::support::{installed, write_script};

fn have_pdsh() -> bool {
    installed(Command::new("pdsh").arg("-V"))
}

fn setup(dir: &Path, worker_body: &str) -> std::path::PathBuf {
    let worker = dir.join("worker");
    write_script(&worker, worker_body);
    std::fs::write(dir.join("hosts"), "node-a slots=4\nnode-b slots=4\n").unwrap();
    let spec = dir.join("s.yaml");
    std::fs::write(
        &spec,
        format!(
            "cluster:\n  gpus_per_node: 4\n  hostfile: hosts\n  include: node-a:1,3@node-b\n  env: {{ZB_TEST: 'a b'}}\nlaunch:\n  method: pdsh\n  pdsh_rcmd: exec\n  master_port: 29777\n  worker: {:?}\nsweep:\n  models: tiny\n  stages: 0\n  nodes: 2\n  gpus_per_node: 2\n",
            worker.to_str().unwrap()
        ),
    )
    .unwrap();
    let plan = Plan::build(Spec::load(&spec).unwrap()).unwrap();
    render(&plan, &dir.join("runs")).unwrap().remove(0)
}

#[test]
fn node_ranks_and_rank_environment() {
    if !have_pdsh() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = setup(
        dir.path(),
        r#"echo "$RANK $LOCAL_RANK $NODE_RANK $WORLD_SIZE $LOCAL_SIZE $MASTER_ADDR $MASTER_PORT $CUDA_VISIBLE_DEVICES $ZB_TEST|$PWD" > "$ZB_OUT/rank$RANK""#,
    );
    let o = Command::new("bash").arg(run.join("job.sbatch")).env("ZB_OUT", dir.path()).output().unwrap();
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let rank = |r: u32| std::fs::read_to_string(dir.path().join(format!("rank{r}"))).unwrap();
    let cwd = run.display();
    assert_eq!(rank(0), format!("0 0 0 4 2 node-a 29777 1,3 a b|{cwd}\n"));
    assert_eq!(rank(1), format!("1 1 0 4 2 node-a 29777 1,3 a b|{cwd}\n"));
    assert_eq!(rank(2), format!("2 0 1 4 2 node-a 29777 0,1 a b|{cwd}\n"));
    assert_eq!(rank(3), format!("3 1 1 4 2 node-a 29777 0,1 a b|{cwd}\n"));
}

#[test]
fn a_failing_rank_fails_the_job_and_stops_its_node() {
    if !have_pdsh() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Rank 3 fails after a second; rank 2, on the same node, would run for 30 s.
    let run = setup(dir.path(), r#"case $RANK in 3) sleep 1; exit 7;; 2) exec sleep 30;; esac"#);
    let t = Instant::now();
    let o = Command::new("bash").arg(run.join("job.sbatch")).env("ZB_OUT", dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "node.sh waited for the rank it should have killed: {:?}",
        t.elapsed()
    );
}

#[test]
fn hosts_outside_the_allocation_are_refused() {
    if !have_pdsh() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = setup(dir.path(), r#"echo ran > "$ZB_OUT/rank$RANK""#);
    let sbatch = std::fs::read_to_string(run.join("job.sbatch")).unwrap();
    assert!(sbatch.contains("#SBATCH --nodelist=node-a,node-b\n"), "the job asks for the hostfile's hosts:\n{sbatch}");
    // scontrol expands hostlists offline given some slurm.conf (a stub keeps it off the network).
    let conf = dir.path().join("slurm.conf");
    std::fs::write(&conf, "ClusterName=stub\nSlurmctldHost=localhost(127.0.0.1)\n").unwrap();
    let job = |nodelist: &str| {
        Command::new("bash")
            .arg(run.join("job.sbatch"))
            .env("ZB_OUT", dir.path())
            .env("SLURM_CONF", &conf)
            .env("SLURM_JOB_NODELIST", nodelist)
            .output()
            .unwrap()
    };
    let o = job("node-b");
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("host node-a of the hostfile is outside this job's allocation"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!dir.path().join("rank0").exists(), "no rank started");
    let o = job("node-a,node-b");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(dir.path().join("rank3").exists());
}
