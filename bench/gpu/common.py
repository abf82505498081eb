"""What the bench/gpu/report*.py scripts share: reading a result archive of
bench/gpu/run.sh, the parts of a rank log a summary needs, and number formats."""
import json
import re
import statistics
import tarfile


def archive_files(path):
    """(member name, text) of every regular file of a result archive."""
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile():
                yield m.name, tar.extractfile(m).read().decode(errors="replace")


def read_archive(path):
    """A result archive as the reports read it: host.txt's text, the rank-0 log of every run by run
    name, and every other file's text by member name (in archive order)."""
    host, logs, files = "", {}, {}
    for name, text in archive_files(path):
        if name.endswith("host.txt"):
            host = text
        elif run := rank0_run(name):
            logs[run] = json_lines(text)
        else:
            files[name] = text
    return host, logs, files


def rank0_run(name):
    """The run name of an archive member `runs/<run>/rank0.jsonl`, else None."""
    m = re.search(r"runs/([^/]+)/rank0\.jsonl$", name)
    return m and m.group(1)


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


def host_date(host):
    """The date line of an archive's host.txt."""
    return re.search(r"date: (\S+)", host).group(1)


def gib(b):
    return f"{b / 2**30:.2f}"
