"""BatchDecoder inside the engines that bring the data: a real local Ray cluster (Ray Data's
map_batches, uneven blocks, two actors) and a local Spark session (predict_batch_udf).  Each result
equals a direct decode of the same rows in this process."""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest
import torch

import hdecode_torch as hd

SPECS = ["wu_palmer", "optimal:hf_beta[beta=0.5]", "majority", "darts[lam=0.5]"]
COLUMNS = ["wu_palmer_optimal", "hf_beta0p5_optimal", "majority", "darts0p5"]
B = 301
CUTS = [0, 7, 8, 150, 151, 290, B]  # uneven blocks, one of a single row


def _tree():
    return hd.load_hierarchy("tieredimagenet-h")


def _logits():
    h = _tree()
    rng = np.random.default_rng(0)
    z = rng.normal(size=(B, h.num_leaves)) * rng.choice([0.3, 1.0, 3.0], size=(B, 1))
    z[np.arange(B), rng.integers(0, h.num_leaves, B)] += rng.uniform(0, 8, B)
    return z.astype(np.float32)


def _direct(z, scaler=None):
    h = _tree()
    x = torch.from_numpy(z)
    if scaler is not None:
        with torch.no_grad():
            x = scaler(x)
    out = {col: hd.get_decoder(spec, h).decode(x, from_logits=True).numpy()
           for col, spec in zip(COLUMNS, ["optimal:wu_palmer", *SPECS[1:]])}
    assert len(np.unique(out["wu_palmer_optimal"])) > 20  # varied answers: the comparison means something
    return out


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    # The workers import this checkout, as the tests do.
    root = os.path.dirname(os.path.dirname(os.path.abspath(hd.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.plan_independent
@pytest.mark.slow
def test_ray_data_map_batches_equals_a_direct_decode(ray_cluster):
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    z = _logits()
    scaler = hd.TemperatureScaler(0.6)
    blocks = [ray.data.from_items([{"id": i, "logits": z[i]} for i in range(a, b)]) for a, b in zip(CUTS, CUTS[1:])]
    ds = blocks[0].union(*blocks[1:]).materialize()
    assert ds.num_blocks() >= len(blocks)
    out = ds.map_batches(hd.BatchDecoder, batch_format="numpy", batch_size=64,
                         compute=ray.data.ActorPoolStrategy(size=2),
                         fn_constructor_kwargs={"hierarchy": _tree(), "decoders": SPECS, "calibrator": scaler,
                                                "keep_scores": False, "device": "cpu"})
    rows = out.take_all()
    assert len(rows) == B and set(rows[0]) == {"id", *COLUMNS}
    rows.sort(key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(B))
    want = _direct(z, scaler)
    for col in COLUMNS:
        np.testing.assert_array_equal(np.stack([r[col] for r in rows]), want[col], err_msg=col)


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs a Java runtime (none on PATH, no JAVA_HOME): install OpenJDK 17 from the system "
                    "packages to run this test")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = os.path.dirname(os.path.dirname(os.path.abspath(hd.__file__)))
    try:
        session = (SparkSession.builder.master("local[2]").appName("hdecode-test")
                   .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                   .config("spark.executorEnv.PYTHONPATH",
                           os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
                   .config("spark.executorEnv.OMP_NUM_THREADS", "1")
                   .getOrCreate())
    except Exception as exc:  # a JVM that does not start: a machine without Spark, not a library failure
        pytest.skip(f"a local Spark session did not start: {type(exc).__name__}: {exc}")
    try:
        yield session
    finally:
        session.stop()
        # stop() leaves the JVM running until this process exits; its gateway ends it now.
        from pyspark import SparkContext

        gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
        if gateway is not None:
            gateway.shutdown()
            proc = getattr(gateway, "proc", None)
            if proc is not None:
                proc.stdin.close()  # the JVM exits when its standard input closes
                proc.wait(timeout=60)


@pytest.mark.plan_independent
@pytest.mark.slow
def test_spark_predict_batch_udf_equals_a_direct_decode(spark):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, BooleanType, FloatType, LongType, StructField, StructType

    h = _tree()
    z = _logits()

    def make_predict_fn():  # run once per Python worker: the tree's tables are built there
        return hd.BatchDecoder(h, SPECS, from_logits=True).predict

    fields = [StructField(c, ArrayType(BooleanType()) if c == "hf_beta0p5_optimal" else LongType()) for c in COLUMNS]
    decode = predict_batch_udf(make_predict_fn, return_type=StructType(fields), batch_size=64,
                               input_tensor_shapes=[[h.num_leaves]])
    schema = StructType([StructField("id", LongType()), StructField("logits", ArrayType(FloatType()))])
    df = spark.createDataFrame([(i, z[i].tolist()) for i in range(B)], schema).repartition(3)
    got = df.select("id", decode("logits").alias("p")).select("id", "p.*").toPandas().sort_values("id")
    assert got["id"].tolist() == list(range(B))
    want = _direct(z)
    for col in COLUMNS:
        np.testing.assert_array_equal(np.stack(got[col].to_numpy()), want[col], err_msg=col)
