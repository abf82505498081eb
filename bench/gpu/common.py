"""What the bench/gpu scripts share: for the reports, reading a result archive of
bench/gpu/run.sh, the parts of a rank log a summary needs, and number formats; for the probes
that run on a GPU host by themselves, the header of the JSON they write."""
import glob
import json
import os
import re
import statistics
import tarfile


def archive_files(path):
    """(member name, text) of every regular file of a result archive."""
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile():
                yield m.name, tar.extractfile(m).read().decode(errors="replace")


def call_folders(path):
    """An archive of device calls laid out TOP/CALL/...: per call (by folder name, sorted) its
    notes.txt, its first host.txt as lines, and every file's text by its path below CALL/."""
    calls = {}
    for name, text in sorted(archive_files(path)):
        parts = name.split("/")
        if len(parts) < 3:
            continue
        call = calls.setdefault(parts[1], {"notes": None, "host": None, "files": {}})
        rel = "/".join(parts[2:])
        if rel == "notes.txt":
            call["notes"] = text.strip()
        elif parts[-1] == "host.txt" and call["host"] is None:
            call["host"] = text.strip().splitlines()
        call["files"][rel] = text
    return calls


def read_archive(path):
    """A result archive as the reports read it: host.txt's text, the log of every run by run name,
    and every other file's text by member name (in archive order).

    A run's log is rank 0's records, except that each step's `step_ms` is the run's: the slowest
    rank's at that step (rank 0's own is kept as `rank_step_ms`). This is the one rule for a
    run's step time, ingest's and the worker summary's: per step the slowest rank, then the median
    over measured steps."""
    host, ranks, files = "", {}, {}
    for name, text in archive_files(path):
        if name.endswith("host.txt"):
            host = text
        elif m := re.search(r"runs/([^/]+)/rank(\d+)\.jsonl$", name):
            ranks.setdefault(m.group(1), {})[int(m.group(2))] = json_lines(text)
        else:
            files[name] = text
    logs = {run: slowest_rank_steps(by_rank) for run, by_rank in ranks.items() if 0 in by_rank}
    return host, logs, files


def slowest_rank_steps(by_rank):
    """Rank 0's records with every step's `step_ms` set to the largest over the ranks that logged
    that step."""
    worst = {}
    for recs in by_rank.values():
        for r in recs:
            if r["event"] == "step":
                worst[r["step"]] = max(worst.get(r["step"], 0.0), r["step_ms"])
    out = []
    for r in by_rank[0]:
        if r["event"] == "step":
            r = dict(r, rank_step_ms=r["step_ms"], step_ms=worst[r["step"]])
        out.append(r)
    return out


def json_lines(text):
    """The records of a JSON-lines text, blank lines skipped."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_parts(recs):
    """A rank log's `start` and `setup` records and its measured (not warm-up) `step` records."""
    start = next(r for r in recs if r["event"] == "start")
    setup = next(r for r in recs if r["event"] == "setup")
    steps = [r for r in recs if r["event"] == "step" and not r["warmup"]]
    return start, setup, steps


def median(steps, key):
    """The median over `steps` of a field (`key` a name) or of a function of the step."""
    value = key if callable(key) else (lambda r: r[key])
    return statistics.median(value(r) for r in steps)


def build_summary(log):
    """What a comparison of two builds reads from a run's records: its measured steps' count, the
    medians of step, forward and backward time, the peak allocated GiB, and every step's loss
    (warm-up ones too: the first steps show where two builds part). None without measured steps."""
    steps = [r for r in log if r["event"] == "step" and not r.get("warmup")]
    if not steps:
        return None
    return {
        "steps": len(steps),
        "step_ms": round(median(steps, "step_ms"), 3),
        "forward_ms": round(median(steps, "forward_ms"), 3),
        "backward_ms": round(median(steps, "backward_ms"), 3),
        "peak_allocated_gib": round(max(r["memory"]["peak_allocated_bytes"] for r in steps) / 2**30, 3),
        "losses": [r["loss"] for r in log if r["event"] == "step"],
    }


def ab_runs(runs_dir, prefix, read):
    """The runs of a phase comparing two builds, folders `<prefix>_<case>_<base|new>_<round>`, as
    {case: {build: {round: read(folder)}}}."""
    found = {}
    for d in glob.glob(os.path.join(runs_dir, prefix + "_*")):
        m = re.search(prefix + r"_(.+)_(base|new)_(\d+)$", d)
        if m and os.path.isdir(d):
            found.setdefault(m.group(1), {}).setdefault(m.group(2), {})[int(m.group(3))] = read(d)
    return found


def rank0_records(run_dir):
    """The records of a run folder's rank 0 log; none where the run left no log."""
    f = os.path.join(run_dir, "rank0.jsonl")
    return json_lines(open(f).read()) if os.path.exists(f) else []


def last_json(path):
    """The last JSON line of a file (an example program's result after its log lines); None
    where it has none."""
    lines = [l for l in open(path).read().splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def offload_run(run_dir):
    """An offloaded run as the offload reports give it: the median step and phases over its
    measured steps, the median rate of the gradients' copies to the host (`comm.d2h`) and the
    parameters' back (`comm.h2d`) as the step records give them (beside the step's other work),
    the parameters each side updates per rank, its ranks and those on its host (whose updates
    share the host's cores), its peak allocated memory, every step's loss and the last one; None
    where the run has no measured step."""
    recs = rank0_records(run_dir)
    if not any(r["event"] == "step" and not r["warmup"] for r in recs):
        return None
    start, setup, steps = run_parts(recs)
    on_device, on_host = offload_split(start, setup)
    med = lambda f: round(median(steps, f), 3)

    def rate(way):
        """Over the steps that copied that way (a delayed run's first exact steps may not)."""
        v = [r["comm"][way]["bus_gbps"] for r in steps if way in r["comm"]]
        return round(statistics.median(v), 2) if v else None
    return {"step_ms": med("step_ms"), "forward_ms": med("forward_ms"), "backward_ms": med("backward_ms"),
            "exposed_comm_ms": med("exposed_comm_ms"), "optimizer_ms": med("optimizer_ms"),
            "d2h_gbps": rate("d2h"), "h2d_gbps": rate("h2d"), "host_params": on_host,
            "device_params": on_device, "ranks": start["world_size"], "ranks_on_host": start["local_size"],
            "peak_allocated_gib": round(max(r["memory"]["peak_allocated_bytes"] for r in steps) / 2**30, 3),
            "losses": [r["loss"] for r in recs if r["event"] == "step"], "final_loss": steps[-1]["loss"]}


def host_rates(runs_dir):
    """The host's AdamW (examples/cpu_adamw's result, `cpu_adamw.json` in `runs_dir`) and its pinned
    copies' GB/s by direction (examples/nccl_bw's `copies.jsonl`) as the same call measured them
    (run.sh's host_rates); None and {} for what the call did not measure."""
    def read(name, parse):
        try:
            return parse(os.path.join(runs_dir, name))
        except OSError:
            return None
    return read("cpu_adamw.json", last_json), read("copies.jsonl", lambda f: copy_rates(open(f).read())) or {}


def offload_rows(runs_dir, pattern, fields, base, adamw_params_per_s, copy_gbps):
    """The run folders of `runs_dir` whose names match `pattern` (a regex whose named groups, with
    `fields` converting them, become the row's keys), each as common.offload_run gives it, with
    its bound (offload_bound, against `base`, the same call's run without offload, counting the
    run's ranks on its host) and step over bound where the run, the base and the host's rates
    are known."""
    rows = []
    for d in sorted(os.listdir(runs_dir)):
        m = re.fullmatch(pattern, d)
        if not m or not os.path.isdir(os.path.join(runs_dir, d)):
            continue
        r = offload_run(os.path.join(runs_dir, d))
        row = {"run": d} | {k: fields[k](v) for k, v in m.groupdict().items()} | {"result": r}
        if r and base and adamw_params_per_s and copy_gbps:
            b = offload_bound(r["device_params"], r["host_params"], base, adamw_params_per_s, min(copy_gbps.values()),
                              r["ranks_on_host"])
            row["bound"] = {k: round(v, 3) for k, v in b.items()} | {"step_over_bound": round(r["step_ms"] / b["bound_ms"], 4)}
        rows.append(row)
    return rows


def steadiness(recs):
    """A run's measured steps as the noise reports give them: the median step (ms) and the
    coefficient of variation over the steps; both None without measured steps."""
    steps = [r["step_ms"] for r in recs if r["event"] == "step" and not r["warmup"]]
    if not steps:
        return {"step_ms": None, "cv": None}
    return {"step_ms": round(statistics.median(steps), 3),
            "cv": round(statistics.pstdev(steps) / statistics.mean(steps), 4)}


def runs_of_a_setting(medians, runs):
    """A configuration's runs under one setting, as the noise reports give them: the runs
    (`runs`), the median of their medians (`medians`, a failed run's None left out), the spread
    between them (largest over smallest, minus one) and how many failed."""
    ok = [m for m in medians if m is not None]
    return {"runs": runs,
            "median_step_ms": round(statistics.median(ok), 3) if ok else None,
            "spread": round(max(ok) / min(ok) - 1, 4) if len(ok) > 1 else None,
            "failed": len(medians) - len(ok)}


def host_date(host):
    """The date of an archive's host.txt: its `date:` line, or a first line that is a bare ISO
    time (as some hand-made calls wrote it); None where it has neither."""
    if m := re.search(r"^date: (\S+)", host, re.M) or re.match(r"\s*(\d{4}-\d\d-\d\dT\S+)", host):
        return m.group(1)
    return None


def gib(b):
    return f"{b / 2**30:.2f}"


def offload_split(start, setup):
    """(parameters the rank's device updates, parameters its host updates) of a run, per rank, from
    its `start` and `setup` records: the optimizer states on the device are 12 bytes per parameter
    it updates, and an offloaded rank (stage 1 on) updates its partition, the padded parameters
    over the ranks."""
    on_device = setup["model_state"]["optimizer_bytes"] / 12
    if start["config"]["offload"] == "none":
        return on_device, 0
    return on_device, setup["padded_params"] / start["world_size"] - on_device


def copy_rates(text):
    """The pinned copies' GB/s by direction ({"d2h": ..., "h2d": ...}) from nccl_bw's copies.jsonl."""
    out = {}
    for line in text.splitlines():
        if line.startswith("{") and re.search(r'"op":"(d2h|h2d)"', line):
            c = json.loads(line)
            out[c["op"]] = c["gbps"]
    return out


def offload_bound(device_params, host_params, base, adamw_params_per_s=None, copy_gbps=None, ranks_on_host=1):
    """The bound an offloaded step is held to (docs/results/offload-and-hpz.md):

        max(GPU compute + the GPU's share of the update, the host's share of the update, transfers)

    GPU compute is `base`'s (the run without offload: forward_ms, backward_ms, optimizer_ms,
    device_params) forward and backward, its update that run's optimizer phase times the share of
    the parameters the device updates; the host's update its parameters, times the ranks whose
    updates share the host's cores (`ranks_on_host`), over the host's AdamW rate; transfers 2
    bytes per host parameter each way over the slower copy direction (GB/s), the two directions
    on their own copy engines. Without the host's AdamW rate only the GPU's part is known, and the
    result has no `bound_ms`; without the copies' bandwidth the bound leaves transfers out."""
    gpu = base["forward_ms"] + base["backward_ms"] + base["optimizer_ms"] * device_params / base["device_params"]
    out = {"gpu_ms": gpu}
    if adamw_params_per_s:
        out["host_adamw_ms"] = host_params * ranks_on_host / adamw_params_per_s * 1e3
        if copy_gbps:
            out["transfer_ms"] = 2 * host_params / (copy_gbps * 1e9) * 1e3
        out["bound_ms"] = max(out.values())
    return out


def probe_header(benchmark):
    """What a probe's JSON starts with: the probe, when, where, on which GPU and versions (torch
    is imported here, so the reports, which run without it, can import this module)."""
    import datetime
    import socket

    import torch

    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
