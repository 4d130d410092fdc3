"""The image Dockerfiles (images/operator, images/worker) and scripts/images.sh, checked without Docker.

The builds themselves prove the images work (their last step runs `elastream-image-check`, a real local Spark
analysis in the operator image); these tests keep the cheap invariants from breaking unnoticed: the operator
Dockerfile's stage order (`--target python` must never download Spark or a JDK with the legacy builder, which
builds every stage before the target), the scripts the Dockerfile writes with printf parse as shell and Python,
the Spark jar groups it removes match jars of the pinned pyspark and none of the jars the analysis loads, the
Java modules Spark needs are in the jlink list, and the dependency split follows operator/pyproject.toml.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import subprocess
import tomllib

import pytest

from support.paths import REPO

OPERATOR = os.path.join(REPO, "images", "operator", "Dockerfile")
WORKER = os.path.join(REPO, "images", "worker", "Dockerfile")
IMAGES_SH = os.path.join(REPO, "scripts", "images.sh")
IMAGES_DOC = os.path.join(REPO, "docs", "images.md")
PYPROJECT = os.path.join(REPO, "operator", "pyproject.toml")

SPARK_STACK = {"pyspark", "pandas", "pyarrow"}
JAR_GROUPS = ["hive", "mllib", "graphx", "streaming", "repl", "kubernetes", "yarn", "mesos", "rocksdb"]
#: jars a local SparkSession running DataFrame SQL over Arrow and Parquet loads: no prune pattern may match them
_NEEDED_JARS = """
    spark-core_ spark-sql_ spark-sql-api_ spark-catalyst_ spark-unsafe_ spark-network-common_ spark-network-shuffle_
    spark-launcher_ spark-kvstore_ spark-common-utils_ spark-tags_ spark-sketch_ hadoop-client-api-
    hadoop-client-runtime- hadoop-shaded-guava- hive-storage-api- parquet- arrow- py4j- antlr4-runtime-
    scala-library- scala-reflect- janino- commons-compiler- snappy-java- lz4-java- zstd-jni- log4j- jackson- netty-
    orc- avro- kryo-shaded- chill xbean-asm9-shaded- json4s- RoaringBitmap- ivy- slf4j- metrics- commons-lang3-
    commons-io- guava- univocity-parsers- snakeyaml-
    """
NEEDED_JAR_PREFIXES = tuple(_NEEDED_JARS.split())
#: Java modules Spark 3.5's local mode cannot start or run a job without (found by jdeps and by trial)
NEEDED_JAVA_MODULES = {
    "java.base",
    "java.desktop",  # java.beans: log4j 2's LoggerContext, Spark's JavaTypeInference
    "java.logging",
    "java.management",
    "java.naming",
    "java.security.jgss",  # Hadoop's UserGroupInformation (javax.security.auth.kerberos)
    "java.security.sasl",
    "java.sql",
    "java.xml",  # Hadoop's Configuration
    "jdk.security.auth",  # Hadoop's UnixLoginModule, loaded by name
    "jdk.unsupported",  # sun.misc.Unsafe: Spark's memory manager, Kryo, Arrow
}


def instructions(path: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of a Dockerfile, continuation lines joined and comment lines dropped as Docker does."""
    result: list[tuple[str, str]] = []
    pending = ""
    with open(path) as handle:
        for raw in handle:
            line = raw.rstrip("\n")
            if line.lstrip().startswith("#") or (pending and not line.strip()):
                continue
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            text = (pending + line).strip()
            pending = ""
            if text:
                keyword, _, args = text.partition(" ")
                result.append((keyword.upper(), args.strip()))
    assert not pending, f"{path} ends inside a continued instruction"
    return result


def stages(path: str) -> list[tuple[str | None, list[tuple[str, str]]]]:
    """(stage name or None, its instructions) in file order."""
    result: list[tuple[str | None, list[tuple[str, str]]]] = []
    for keyword, args in instructions(path):
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            result.append((name, [(keyword, args)]))
        elif result:
            result[-1][1].append((keyword, args))
    return result


def run_text(stage: list[tuple[str, str]]) -> str:
    return "\n".join(args for keyword, args in stage if keyword == "RUN")


@functools.cache
def operator_text() -> str:
    return "\n".join(f"{k} {a}" for k, a in instructions(OPERATOR))


def test_operator_stage_order_keeps_the_python_target_free_of_spark_and_java() -> None:
    names = [name for name, _ in stages(OPERATOR)]
    assert names == ["build", "venv-python", "python", "build-spark", "venv-spark", "jre", None]
    by_name = dict(stages(OPERATOR)[:-1])
    upto_python = "\n".join(run_text(by_name[n]) for n in ("build", "venv-python", "python"))
    assert "requirements-spark" not in upto_python.replace("/tmp/requirements-spark.txt', 'w'", "")
    assert "openjdk" not in upto_python and "jlink" not in upto_python
    copies = [a for k, a in by_name["python"] if k == "COPY"]
    assert copies == ["--from=venv-python /opt/elastream /opt/elastream"]
    final = stages(OPERATOR)[-1][1]
    assert [a for k, a in final if k == "COPY"] == [
        "--from=jre /opt/java /opt/java",
        "--from=venv-spark /opt/elastream /opt/elastream",
    ]


@pytest.mark.parametrize("stage", ["python", None])
def test_operator_final_stages_run_locked_down_and_check_themselves(stage: str | None) -> None:
    body = dict(stages(OPERATOR))[stage]
    keywords = [k for k, _ in body]
    assert ("USER", "10001:10001") in body
    assert ("ENTRYPOINT", '["elastream"]') in body
    last_run = [a for k, a in body if k == "RUN"][-1]
    assert "elastream-image-check" in last_run
    assert keywords.index("USER") < len(keywords) - 1 - keywords[::-1].index("RUN"), "the check runs as the user"
    env = " ".join(a for k, a in body if k == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    if stage is None:
        assert "JAVA_HOME=/opt/java" in env and "SPARK_LOCAL_DIRS=/tmp" in env


def printf_scripts(path: str) -> list[tuple[str, str]]:
    """(name, text) of the files a Dockerfile writes with `printf '%s\\n' 'line' ... > /usr/local/bin/NAME`,
    produced by sh as the build produces them."""
    text = "\n".join(a for k, a in instructions(path) if k == "RUN")
    found = []
    for match in re.finditer(r"(printf '%s\\n'(?:\s+'[^']*')+)\s*>\s*(/usr/local/bin/[\w-]+)", text):
        command, target = match.groups()
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        found.append((os.path.basename(target), out.stdout))
    return found


def test_scripts_written_by_the_operator_dockerfile_parse(tmp_path) -> None:
    scripts = printf_scripts(OPERATOR)
    assert sorted(name for name, _ in scripts) == [
        "elastream-image-check",  # the python variant's
        "elastream-image-check",  # the default image's
        "strip-venv",
        "trim-tests",
    ]
    for index, (name, text) in enumerate(scripts):
        assert text.startswith("#!/bin/sh\n"), name
        script = tmp_path / f"{index}-{name}"
        script.write_text(text)
        subprocess.run(["sh", "-n", str(script)], check=True)
        for python in re.findall(r'python - <<"EOF"\n(.*?)\nEOF\n', text, flags=re.S):
            compile(python, name, "exec")
    python_check, spark_check = [text for name, text in scripts if name == "elastream-image-check"]
    # the Spark check fails unless Spark itself ran, and compares it with the Python reference
    assert 'analyzer.engine_used == "spark"' in spark_check
    assert 'analyze("--engine", "python")' in spark_check and "unified_diff" in spark_check
    assert '"pyspark", "pandas", "pyarrow"' in python_check


def test_dependency_split_follows_pyproject() -> None:
    with open(PYPROJECT, "rb") as handle:
        deps = tomllib.load(handle)["project"]["dependencies"]
    names = {re.split(r"[\s\[<>=!~;(]", d, maxsplit=1)[0].lower() for d in deps}
    assert names >= SPARK_STACK
    assert "spark = {'pyspark', 'pandas', 'pyarrow'}" in operator_text()
    worker = "\n".join(a for k, a in instructions(WORKER) if k == "RUN")
    excluded = re.search(r"excluded = \{([^}]*)\}", worker)
    assert excluded is not None
    assert {n.strip(" '") for n in excluded.group(1).split(",")} >= SPARK_STACK


def prune_groups() -> dict[str, list[str]]:
    groups = {}
    for group, patterns in re.findall(r"prune (\w+) ((?:'[^']*'\s*)+);", operator_text()):
        groups[group] = re.findall(r"'([^']*)'", patterns)
    return groups


def test_jar_groups_are_the_documented_ones() -> None:
    assert list(prune_groups()) == JAR_GROUPS
    with open(IMAGES_SH) as handle:
        assert " ".join(JAR_GROUPS) in handle.read()
    with open(IMAGES_DOC) as handle:
        doc = handle.read()
    for group in JAR_GROUPS:
        assert f"`{group}`" in doc, f"docs/images.md does not describe the jar group {group}"


def installed_pyspark_jars() -> list[str]:
    pyspark = pytest.importorskip("pyspark")
    with open(PYPROJECT, "rb") as handle:
        deps = tomllib.load(handle)["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("pyspark"))
    if pin.replace(" ", "") != f"pyspark=={pyspark.__version__}":
        pytest.skip(f"the installed pyspark {pyspark.__version__} is not the pinned one ({pin})")
    return sorted(os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars")))


def test_jar_patterns_match_pinned_pyspark_and_spare_what_the_analysis_loads() -> None:
    jars = installed_pyspark_jars()
    removed = set()
    for group, patterns in prune_groups().items():
        for pattern in patterns:
            matched = fnmatch.filter(jars, pattern)
            assert matched, f"{group}: {pattern} matches no jar of the pinned pyspark (the build would fail)"
            removed.update(matched)
    needed = [j for j in jars if j.startswith(NEEDED_JAR_PREFIXES)]
    assert len(needed) > 50
    assert not removed & set(needed), f"the prune lists remove jars the analysis loads: {sorted(removed & set(needed))}"


def test_jlink_keeps_the_modules_spark_needs() -> None:
    match = re.search(r"ARG JAVA_MODULES=(\S+)", operator_text())
    assert match is not None
    modules = set(match.group(1).split(","))
    assert modules >= NEEDED_JAVA_MODULES, sorted(NEEDED_JAVA_MODULES - modules)


def test_images_sh_builds_the_python_variant() -> None:
    subprocess.run(["bash", "-n", IMAGES_SH], check=True)
    with open(IMAGES_SH) as handle:
        text = handle.read()
    assert 'operator-python) echo "elastream-operator:$TAG-python"' in text
    assert "operator-python) echo python" in text
    assert "SPARK_KEEP=$SPARK_KEEP" in text
