"""What the mutants scripts (mutants.sh, mutants-recheck.sh, mutants-remainder.sh,
mutants-summary.py) share: the accepted survivors, cargo-mutants' outcomes, a mutant's name
without its line, and the result file of a run."""
import datetime
import json
import re
import socket

ACCEPTED = "bench/mutants-accepted.txt"


class Accepted(dict):
    """Accepted survivors, by their names without the line (`placeless`): a survivor is accepted
    wherever lines added above it have moved it."""

    def reason(self, name):
        """Why the survivor `name` is accepted, or None."""
        return self.get(placeless(name))

    def __contains__(self, name):
        return dict.__contains__(self, placeless(name))


def accepted():
    """Accepted survivors: mutant name (placeless) -> the reason given for it."""
    out = Accepted()
    for line in open(ACCEPTED):
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, why = line.partition(" # ")
            out[placeless(name.strip())] = why.strip()
    return out


def outcomes(path):
    """(mutant name, outcome) for every mutant of a cargo-mutants outcomes.json, baseline left out."""
    o = json.load(open(path))
    return [(r["scenario"]["Mutant"]["name"], r["summary"]) for r in o["outcomes"] if isinstance(r["scenario"], dict)]


# file:line:column: change in function
NAME = re.compile(r"^([^:]+):[0-9]+:([0-9]+): (.*)$")


def placeless(name):
    """A mutant's name without its line: the file, the column, the change and the function, which
    stay the same when lines are added or removed above the mutated one."""
    m = NAME.match(name)
    return f"{m[1]}:{m[2]}: {m[3]}" if m else name


def placeless_pattern(name):
    """A cargo-mutants --re pattern for the mutant `name` wherever its line is now."""
    m = NAME.match(name)
    if not m:
        return "^" + re.escape(name) + "$"
    return "^" + re.escape(m[1]) + ":[0-9]+:" + m[2] + ": " + re.escape(m[3]) + "$"


def caught_placeless(rows):
    """From a recheck's outcomes, the placeless names of which every mutant found was caught."""
    seen = {}
    for r in rows:
        k = placeless(r["mutant"])
        seen[k] = seen.get(k, True) and r["outcome"] == "CaughtMutant"
    return {k for k, caught in seen.items() if caught}


def result(outcomes_path, package, shard, benchmark="scripts/mutants.sh", keys=None):
    """The result file of one cargo-mutants run (mutants.sh, mutants-remainder.sh): the counts,
    the share caught among the viable mutants, every survivor with whether it is accepted, and the
    name of every mutant that ran (so that later runs can tell which mutants none has covered).
    With `keys`, only the mutants whose placeless names are among them count."""
    acc = accepted()
    counts, missed, ran = {}, [], []
    for name, s in outcomes(outcomes_path):
        if keys is not None and placeless(name) not in keys:
            continue
        ran.append(name)
        counts[s] = counts.get(s, 0) + 1
        if s == "MissedMutant":
            missed.append({"mutant": name, "accepted": acc.reason(name)})
    caught = counts.get("CaughtMutant", 0)
    viable = caught + counts.get("MissedMutant", 0) + counts.get("Timeout", 0)
    unaccepted = sum(1 for m in missed if m["accepted"] is None)
    return {
        "benchmark": benchmark, "package": package, "shard": shard,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "counts": counts,
        "caught_share_of_viable": caught / viable if viable else None,
        "caught_share_with_accepted": (viable - unaccepted) / viable if viable else None,
        "missed": missed, "ran": ran}
