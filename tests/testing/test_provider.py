"""The fake provider that ships in ``outlines.testing``: job mode offline, from any directory, without the suite."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import outlines
from outlines import models
from outlines.backends.jobs import Backoff
from outlines.cache import Cache
from outlines.testing import FakeProvider, JobPlan

PACKAGE = Path(outlines.__file__).resolve().parent
FAST = outlines.Jobs(backoff=Backoff(first=0.01, cap=0.05))

SCRIPT = textwrap.dedent('''
    import json
    import importlib.util

    import outlines
    from outlines import models
    from outlines.backends.jobs import Backoff
    from outlines.testing import FakeProvider

    assert importlib.util.find_spec("tests") is None, "the test suite must not be importable here"
    fast = outlines.Jobs(backoff=Backoff(first=0.01, cap=0.05))
    word = outlines.string("word")
    words = [f"w{i}" for i in range(6)]
    with FakeProvider(speed=1000, reply=lambda prompt, sample, body: prompt.upper()) as provider:
        gpt = models.openai("gpt-4o-mini", base_url=provider.base_url, api_key="sk-fake", max_tokens=8)
        claude = models.anthropic("claude-haiku-4-5", base_url=provider.anthropic_url, api_key="sk-fake",
                                  max_tokens=8)
        both = outlines.eval(gpt("say " + word), claude("tell " + word), givens={word: words}, jobs=fast)
        print(json.dumps({"answers": [v.tolist() for v in both], "stats": provider.stats()}))
''')


def test_a_script_outside_the_checkout_runs_batch_mode_against_the_shipped_fake(tmp_path: Path) -> None:
    # Only the package is importable (as after `pip install`), and the script runs from an unrelated folder.
    site = tmp_path / "site"
    site.mkdir()
    (site / "outlines").symlink_to(PACKAGE, target_is_directory=True)
    work = tmp_path / "work"
    work.mkdir()
    (work / "try_batch.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), OUTLINES_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-P", "try_batch.py"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    words = [f"w{i}" for i in range(6)]
    assert out["answers"] == [[f"SAY {w}".upper() for w in words], [f"TELL {w}".upper() for w in words]]
    stats = out["stats"]
    assert stats["live"] == 0  # everything went as jobs
    assert stats["counts"]["batches.create"] == 1 and stats["counts"]["message_batches.create"] == 1
    assert (stats["jobs"], stats["submitted"], stats["paid"], stats["paid_twice"]) == (2, 12, 12, [])


def test_importing_outlines_leaves_the_fake_out() -> None:
    code = "import sys, outlines; print(sorted(m for m in sys.modules if m.startswith('outlines.testing')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(PACKAGE.parent)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_planned_failure_reaches_the_draws_with_the_providers_reason(tmp_path: Path) -> None:
    word = outlines.string("word")
    with FakeProvider(speed=1000) as provider:
        llm = models.openai("gpt-4o-mini", base_url=provider.base_url, api_key="sk-fake", max_tokens=8)
        provider.plan(JobPlan(fail="the input is invalid"))
        out = outlines.eval(llm("say " + word), givens={word: ["a", "b"]}, jobs=FAST, errors="return",
                            cache=Cache(tmp_path))
        stats = provider.stats()
    assert all(isinstance(v, outlines.Failure) and "the input is invalid" in v.message for v in out.tolist())
    assert (stats["jobs"], stats["paid"]) == (1, 0)


def test_what_the_fake_cannot_run_is_refused_as_the_provider_refuses_it() -> None:
    openai = pytest.importorskip("openai")
    with FakeProvider() as provider:
        client = openai.OpenAI(base_url=provider.base_url, api_key="sk-fake", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
            client.files.create(file=("in.jsonl", b"{}\n"), purpose="user_data")
        two_models = b"".join(
            json.dumps({"custom_id": name, "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}}).encode() + b"\n"
            for name, model in (("a", "gpt-4o-mini"), ("b", "gpt-4o")))
        uploaded = client.files.create(file=("in.jsonl", two_models), purpose="batch")
        job = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    assert job.status == "validating"
    assert [str(r) for r in provider.refusals] == [
        "/v1/files: a batch's input file is uploaded with purpose 'batch', not 'user_data'",
        "batch input file: The input file holds requests for 2 models (gpt-4o, gpt-4o-mini); a batch's requests"
        " all use one model."]
