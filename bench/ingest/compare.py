"""Reference readers for the ingest benchmark: polars and DuckDB doing the core of ingest's job on
the same worker logs, on the same cores: parse every record, take per run and step the slowest
rank, then per run the median step time after 2 warmup steps and the total tokens.

    compare.py {polars-read|polars-scan|duckdb} LOG_ROOT

Prints one JSON object: the seconds of the read and query (timed inside the process, after
imports), the per-run medians (to check ingest's figures against) and the library version.
BENCH_THREADS sets the threads (default 2).
"""

import glob
import json
import os
import sys
import time


def main() -> None:
    tool, root = sys.argv[1], sys.argv[2]
    threads = int(os.environ.get("BENCH_THREADS", "2"))
    files = sorted(glob.glob(os.path.join(root, "**", "rank*.jsonl"), recursive=True))
    if tool.startswith("polars"):
        os.environ["POLARS_MAX_THREADS"] = str(threads)  # read by polars at import
        import polars as pl

        schema = {"event": pl.String, "rank": pl.Int64, "step": pl.Int64, "tokens": pl.Int64, "step_ms": pl.Float64}
        t0 = time.perf_counter()
        if tool == "polars-read":
            frames = [pl.read_ndjson(f, schema=schema).with_columns(pl.lit(os.path.dirname(f)).alias("run")) for f in files]
            df = pl.concat(frames).lazy()
        else:
            df = pl.scan_ndjson(files, schema=schema, include_file_paths="file").with_columns(
                pl.col("file").str.replace(r"/[^/]*$", "").alias("run")
            )
        out = (
            df.filter((pl.col("event") == "step") & (pl.col("step") >= 2))
            .group_by(["run", "step"])
            .agg(pl.col("step_ms").max(), pl.col("tokens").max())
            .group_by("run")
            .agg(pl.col("step_ms").median().alias("median"), pl.col("tokens").sum())
            .collect()
        )
        seconds = time.perf_counter() - t0
        medians = dict(zip(out["run"].to_list(), out["median"].to_list()))
        version = pl.__version__
    elif tool == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.execute(f"SET threads = {threads}")
        pattern = os.path.join(root, "**", "rank*.jsonl").replace("'", "''")
        t0 = time.perf_counter()
        rows = con.execute(
            f"""
            WITH s AS (
                SELECT regexp_replace(filename, '/[^/]*$', '') AS run, step,
                       max(step_ms) AS step_ms, max(tokens) AS tokens
                FROM read_json('{pattern}', format = 'newline_delimited', filename = true,
                     columns = {{'event': 'VARCHAR', 'rank': 'BIGINT', 'step': 'BIGINT',
                                 'tokens': 'BIGINT', 'step_ms': 'DOUBLE'}})
                WHERE event = 'step' AND step >= 2
                GROUP BY ALL)
            SELECT run, median(step_ms), sum(tokens) FROM s GROUP BY run
            """
        ).fetchall()
        seconds = time.perf_counter() - t0
        medians = {r[0]: r[1] for r in rows}
        version = duckdb.__version__
    else:
        raise SystemExit(f"unknown tool {tool}")
    print(json.dumps({"tool": tool, "version": version, "seconds": seconds, "files": len(files), "medians": medians}))


if __name__ == "__main__":
    main()
