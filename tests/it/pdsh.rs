//! The pdsh method with the real pdsh, `-R exec` standing in for ssh (every "host" runs here):
//! node ranks from `%n`, the rank environment node.sh sets, and a failing rank failing the job
//! instead of leaving the others running.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use zerobench_launcher::render::render;
use zerobench_launcher::{Plan, Spec};

use crate::support::{
    free_port, installed, losses, max_rel_diff, on_text, records, repo, skip, train, worker, write_script, TINY_FP32,
};

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

/// Starts the job of a run whose ranks record their pids, sleep, and mark that they got SIGTERM;
/// returns once all four run.
fn start_sleeping_ranks(dir: &Path) -> (std::path::PathBuf, std::process::Child) {
    let run = setup(
        dir,
        r#"trap 'kill $!; touch "$ZB_OUT/stopped$RANK"; exit 143' TERM; echo $$ > "$ZB_OUT/pid$RANK.tmp"; mv "$ZB_OUT/pid$RANK.tmp" "$ZB_OUT/pid$RANK"; sleep 60 & wait"#,
    );
    let job = Command::new("bash").arg(run.join("job.sbatch")).env("ZB_OUT", dir).spawn().unwrap();
    let t = Instant::now();
    while !(0..4).all(|r| dir.join(format!("pid{r}")).exists()) {
        assert!(t.elapsed() < Duration::from_secs(30), "the ranks did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (run, job)
}

/// Waits for all four ranks' marks; past 20 s kills them (and the job) and fails with `why`.
fn wait_until_stopped(dir: &Path, job: &mut std::process::Child, why: &str) {
    let t = Instant::now();
    while !(0..4).all(|r| dir.join(format!("stopped{r}")).exists()) {
        if t.elapsed() > Duration::from_secs(20) {
            for r in 0..4 {
                let pid = std::fs::read_to_string(dir.join(format!("pid{r}"))).unwrap();
                let _ = Command::new("pkill").args(["-9", "-P", pid.trim()]).status();
                let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            }
            let _ = job.kill();
            panic!("{why}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = job.wait();
}

/// A node's script that is told to stop (SIGTERM, by Slurm on its node or by hand) stops its
/// ranks with it; they ran on.
#[test]
fn a_node_told_to_stop_stops_its_ranks() {
    if !have_pdsh() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (run, mut job) = start_sleeping_ranks(dir.path());
    // SIGTERM to the node scripts only, not their ranks.
    let nodes = Command::new("pgrep").args(["-f", &format!("{}/node.sh", run.display())]).output().unwrap();
    let pids: Vec<String> = String::from_utf8_lossy(&nodes.stdout).split_whitespace().map(String::from).collect();
    assert!(!pids.is_empty(), "no node.sh running");
    assert!(Command::new("kill").arg("-TERM").args(&pids).status().unwrap().success());
    wait_until_stopped(dir.path(), &mut job, "the ranks ran on after their node's script was stopped");
}

/// A job cancelled or out of time: Slurm stops the job's script and pdsh, and over ssh nothing
/// reaches the nodes' node.sh. The job's script tells each node's to stop its ranks (they trained
/// on). Here `-R exec` stands in for ssh; only the job's script and pdsh get the signal.
#[test]
fn a_stopped_job_stops_the_ranks_of_every_node() {
    if !have_pdsh() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, mut job) = start_sleeping_ranks(dir.path());
    let script = job.id().to_string();
    // The script's one child is pdsh (its binary may be named pdsh.bin).
    let pdsh = Command::new("pgrep").args(["-P", &script]).output().unwrap();
    let pdsh: Vec<String> = String::from_utf8_lossy(&pdsh.stdout).split_whitespace().map(String::from).collect();
    assert_eq!(pdsh.len(), 1, "the job's script has no single child: {pdsh:?}");
    assert!(Command::new("kill").args(["-TERM", &script, &pdsh[0]]).status().unwrap().success());
    wait_until_stopped(dir.path(), &mut job, "the nodes' ranks ran on after their job was stopped");
    assert_eq!(job.wait().unwrap().code(), Some(143));
    // Each node's script removes its pid file as it exits, which it does on its own once its
    // ranks are gone (the job's script does not wait for it): on a loaded host, moments later.
    let pid_files = || {
        std::fs::read_dir(dir.path().join("runs")).unwrap().flatten().any(|e| {
            std::fs::read_dir(e.path()).unwrap().flatten().any(|f| f.file_name().to_string_lossy().ends_with(".pid"))
        })
    };
    let t = Instant::now();
    while pid_files() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!pid_files(), "a node's pid file was left");
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

/// A private sshd on a free port of this host (its own host key, one authorised client key,
/// listening on 127.0.0.1 only), stopped when dropped.
struct Sshd {
    child: std::process::Child,
    port: u16,
    key: std::path::PathBuf,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an sshd for root, or `None` (skipped, or failed under `ZEROBENCH_REQUIRE_SLURM`) where
/// there is none or this is not root (sshd separates privileges only as root).
fn sshd() -> Option<Sshd> {
    if !installed(Command::new("/usr/sbin/sshd").arg("-h")) || !installed(Command::new("ssh-keygen").arg("-?")) {
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("sshd needs root here");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    for key in ["host_key", "client_key"] {
        let o =
            Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", ""]).arg("-f").arg(p(key)).output().unwrap();
        assert!(o.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&o.stderr));
    }
    std::fs::copy(p("client_key.pub"), p("authorized_keys")).unwrap();
    // The privilege separation directory sshd insists on.
    std::fs::create_dir_all("/run/sshd").unwrap();
    let port = free_port();
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\nPidFile {}\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
         StrictModes no\nUsePAM no\n",
        p("host_key").display(),
        p("authorized_keys").display(),
        p("sshd.pid").display()
    );
    std::fs::write(p("sshd_config"), config).unwrap();
    let log = p("sshd.log");
    let child = Command::new("/usr/sbin/sshd")
        .arg("-D")
        .arg("-e")
        .arg("-f")
        .arg(p("sshd_config"))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let sshd = Sshd { child, port, key: p("client_key"), log, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sshd did not listen: {}", std::fs::read_to_string(&sshd.log).unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(sshd)
}

/// pdsh over a real ssh, on a custom port (`launch.ssh_port`, DeepSpeed's `--ssh_port`): node.sh
/// arrives through sshd with nothing of the submitting shell, starts the node's two ranks, and
/// they meet through the environment rendezvous. Tiny at stage 3 on the two ranks trains the same
/// model as stage 0 on one MPI rank. (One node: two "nodes" that are this host under two names
/// would be one host to the ranks, which find their local ranks by host name; the node ranks of
/// several hosts are `node_ranks_and_rank_environment`'s.)
#[test]
fn pdsh_over_ssh_on_a_custom_port_trains_like_mpi() {
    if !have_pdsh() {
        return;
    }
    let Some(sshd) = sshd() else { return };
    let dir = tempfile::tempdir().unwrap();
    let text = repo("tests/data/declaration-of-independence.txt");
    std::fs::write(dir.path().join("hosts"), "127.0.0.1 slots=2\n").unwrap();
    let master_port = free_port();
    let spec = dir.path().join("s.yaml");
    std::fs::write(
        &spec,
        format!(
            "cluster:\n  hostfile: hosts\n  env: {{LD_LIBRARY_PATH: {:?}}}\nlaunch:\n  method: pdsh\n  pdsh_rcmd: ssh\n  ssh_port: {}\n  master_port: {master_port}\n  worker: {:?}\n\
             worker: {{seq_len: 64, lr: 0.001, steps: 20, device: cpu, data: {:?}}}\n\
             sweep:\n  models: tiny\n  stages: 3\n  precision: fp32\n  nodes: 1\n  ranks_per_node: 2\n  micro_batches: 3\n",
            std::env::var("LD_LIBRARY_PATH").unwrap_or_default(),
            sshd.port,
            worker().to_str().unwrap(),
            text.to_str().unwrap()
        ),
    )
    .unwrap();
    let plan = Plan::build(Spec::load(&spec).unwrap()).unwrap();
    let run = render(&plan, &dir.path().join("runs")).unwrap().remove(0);
    let sbatch = std::fs::read_to_string(run.join("job.sbatch")).unwrap();
    let port_line =
        format!("export PDSH_SSH_ARGS_APPEND=\"${{PDSH_SSH_ARGS_APPEND:+$PDSH_SSH_ARGS_APPEND }}-p {}\"", sshd.port);
    assert!(sbatch.contains(&port_line), "{sbatch}");
    // The client's key and a throwaway known-hosts file; the port comes from the job.
    let client = format!(
        "-i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes",
        sshd.key.display()
    );
    let o = Command::new("bash").arg(run.join("job.sbatch")).env("PDSH_SSH_ARGS_APPEND", client).output().unwrap();
    let log = std::fs::read_to_string(&sshd.log).unwrap();
    assert!(
        o.status.success(),
        "{}{}\nsshd:\n{log}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(log.matches("Accepted publickey for root").count(), 1, "one ssh session for the node:\n{log}");
    let ranks: Vec<_> = (0..2).map(|r| records(&run.join("logs").join(format!("rank{r}.jsonl")))).collect();
    for recs in &ranks {
        let Some(zerobench_schema::log::Record::Start(s)) = recs.first() else { panic!("no start record") };
        assert_eq!((s.world_size, s.nodes, s.rank_source.as_str()), (2, 1, "env"), "{s:?}");
    }
    let reference = losses(
        &train(1, &dir.path().join("ref"), &on_text(&[TINY_FP32, &["--stage", "0", "--micro-batch", "6"]].concat()))[0],
    );
    let diff = max_rel_diff(&losses(&ranks[0]), &reference);
    assert!(diff <= 1e-5, "stage 3 over pdsh and ssh: relative loss difference {diff:e}");
}
