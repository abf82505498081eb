"""What the mutants scripts (mutants.sh, mutants-recheck.sh, mutants-summary.py) read alike:
the accepted survivors and cargo-mutants' outcomes."""
import json

ACCEPTED = "bench/mutants-accepted.txt"


def accepted():
    """Accepted survivors: mutant name -> the reason given for it."""
    out = {}
    for line in open(ACCEPTED):
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, why = line.partition(" # ")
            out[name.strip()] = why.strip()
    return out


def outcomes(path):
    """(mutant name, outcome) for every mutant of a cargo-mutants outcomes.json, baseline left out."""
    o = json.load(open(path))
    return [(r["scenario"]["Mutant"]["name"], r["summary"]) for r in o["outcomes"] if isinstance(r["scenario"], dict)]
