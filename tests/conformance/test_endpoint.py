"""`verify --endpoint` / `verify --outputs` (conformance/endpoint/): the protocol, the judging of each request and
the float64 tie check, against a stand-in server (tests/conformance/endpoint_standin.py) decoding with the reference
or with a planted bug. The real servers (vLLM's, llama-server) are driven in .ci/engines."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
import sys
import time

import pytest
import torch
from conftest import make_pair
from endpoint_standin import StandIn, serving

from dflash_ref.conformance.bundle import find_bundles
from dflash_ref.conformance.endpoint import LineError, verify_endpoint, verify_outputs
from dflash_ref.conformance.endpoint.check import ending
from dflash_ref.conformance.endpoint.client import Endpoint, EndpointError, parse_completion, parse_counters
from dflash_ref.conformance.endpoint.expected import RequestsError, from_bundles
from dflash_ref.conformance.endpoint.ties import float64_norms, resolution
from dflash_ref.conformance.golden import generate_golden
from dflash_ref.conformance.judge import acceptance_parts, accepted_bounds
from dflash_ref.decoding import generate, spec_generate
from dflash_ref.drafts.checkpoint import load_draft, save_draft
from dflash_ref.drafts.random_draft import randomize_
from dflash_ref.loading.folder import load_target, load_tokenizer
from dflash_ref.target.checkpoint import save_target

pytestmark = pytest.mark.usefixtures("one_thread_module")
quiet = lambda line: None  # noqa: E731


def engine_of(target, draft, lie_at: int | None = None):
    """A stand-in engine decoding with the reference's loop on these models; `lie_at`: its output token there
    replaced by the next id (a bug)."""

    def engine(prompt, max_tokens, stops, body=None):
        out = spec_generate(draft, target, torch.tensor([prompt]), max_tokens, stops)
        ids = out.output_ids[0, len(prompt) :].tolist()
        if lie_at is not None and lie_at < len(ids):
            ids[lie_at] = (ids[lie_at] + 1) % (target.config.vocab_size - 1)
        return ids, sum(out.acceptance_lengths), out.acceptance_lengths

    return engine


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    generate_golden(out, ["multiround"])
    return out


@pytest.fixture(scope="module")
def models(bundle):
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    return load_target(path / "target", dtype=torch.float32), load_draft(path / "draft", torch.float32)


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
def test_a_server_that_decodes_as_the_reference_passes_with_its_acceptance_held_exactly(bundle, models, flavor):
    standin = StandIn(engine_of(*models), flavor)
    with serving(standin) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
    (result,) = report.results
    assert result.status == "pass", report.text()
    low, high = result.bounds
    assert low <= result.accepted <= high and high > 0
    assert report.passed() and result.observed, report.text()
    assert result.speculation.startswith("observed: its counters" if flavor == "vllm" else "observed: its response")
    body = standin.requests[0]
    assert body["prompt"] == result.request.prompt_ids and body["temperature"] == 0.0
    assert f"the server accepted {result.accepted / sum(result.request.taus):.3f}" in report.text()


def test_a_draft_that_sees_another_context_shows_as_acceptance_below_the_references(bundle, models):
    target, draft = models
    other = randomize_(load_draft(next(p for p in bundle.iterdir() if p.is_dir()) / "draft", torch.float32), 99)
    with serving(StandIn(engine_of(target, other))) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
    (result,) = report.results
    assert result.status == "FAIL" and "the draft saw another context" in result.acceptance, report.text()
    assert result.accepted < result.bounds[0]
    with serving(StandIn(engine_of(target, other))) as url:  # in bfloat16 the count is reported, not judged
        soft = verify_endpoint(url, bundle, dtype="bfloat16", progress=quiet)
    assert soft.results[0].status == "pass" and "not judged in bfloat16" in soft.results[0].acceptance


def test_a_wrong_token_is_a_fail_at_its_position_with_its_float64_margin(bundle, models):
    with serving(StandIn(engine_of(*models, lie_at=2))) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
    (result,) = report.results
    assert result.status == "FAIL" and result.output.startswith("diverges at 2:"), report.text()
    d = result.divergences[0]
    assert d.index == 2 and not d.tie and d.margin >= d.resolution
    assert "not compared" in result.acceptance and not report.passed()


def test_a_server_that_shows_no_speculation_is_unobserved_unless_the_operator_takes_outputs_only(bundle, models):
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    tokenizer = load_tokenizer(path / "target")  # the bundle's stub one: the text re-tokenizes to the ids
    with serving(StandIn(engine_of(*models), "plain", text=tokenizer.decode)) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
        taken = verify_endpoint(url, bundle, progress=quiet, outputs_only=True)
    (result,) = report.results
    assert result.status == "unobserved" and "re-tokenized from the server's text" in result.note, report.text()
    assert result.observed is None and result.speculation.startswith("not observed")
    assert report.verdict() == "unobserved" and not report.passed() and "UNOBSERVED: 1 request" in report.text()
    (result,) = taken.results
    assert result.status == "pass" and "taken as outputs only (--outputs-only)" in result.speculation, taken.text()
    assert result.acceptance == "not reported: outputs only" and taken.passed()
    with serving(StandIn(engine_of(*models), "plain", text=lambda ids: "?" * len(ids))) as url:
        wrong = verify_endpoint(url, bundle, progress=quiet)
    assert wrong.results[0].status == "FAIL"  # text that is not the output's: never a pass


def ar_engine_of(target):
    """A stand-in engine that decodes the target alone, a token a pass: the same output, no speculation."""

    def engine(prompt, max_tokens, stops, body=None):
        out = generate(target, torch.tensor([prompt]), max_tokens, stops)
        return out.output_ids[0, len(prompt) :].tolist(), 0, []

    return engine


def test_speculation_is_seen_in_a_stream_of_steps_and_not_in_one_of_tokens(bundle, models):
    """A server without counters or fields: each request is sent again streamed, and a server that commits a step at
    a time streams the reference's τ + 1 a chunk; its plain engine, with the same output, streams a token a chunk."""
    speculative, plain = StandIn(engine_of(*models)), StandIn(ar_engine_of(models[0]))
    for standin in (speculative, plain):
        standin.metrics_on = False
    with serving(speculative) as url:
        seen = verify_endpoint(url, bundle, progress=quiet)
    with serving(plain) as url:
        unseen = verify_endpoint(url, bundle, progress=quiet)
    (result,) = seen.results
    assert result.status == "pass" and result.observed, seen.text()
    assert "sent again streamed, it streamed the reference's steps" in result.speculation
    assert [b.get("stream", False) for b in speculative.requests][:2] == [False, True]  # then the probes
    (result,) = unseen.results
    assert result.status == "unobserved" and result.observed is False, unseen.text()
    assert "streamed one token a chunk where the reference committed up to" in result.speculation
    assert unseen.verdict() == "unobserved"


def test_streamed_chunks_without_ids_are_read_from_their_own_text(bundle, models, tmp_path):
    """llama-server streams no logprobs, so no ids, for the draft tokens it accepted: those chunks' ids come from
    their own text (the bundle's target has a tokenizer), said in the note; never a short output."""
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": p, "max_tokens": 10}) + "\n" for p in ([1, 2, 3], [4, 2])))
    standin = StandIn(engine_of(*models), "llamacpp", text=load_tokenizer(path / "target").decode)
    standin.gaps, standin.delay = True, 0.01
    with serving(standin) as url:
        report = verify_endpoint(url, target=path / "target", draft=path / "draft", prompts=prompts,
                                 conditions=["concurrent"], progress=quiet)  # fmt: skip
    assert [r.status for r in report.results] == ["pass", "pass"], report.text()
    assert "streamed chunks it gave none for re-tokenized from their text" in report.results[0].note
    assert report.results[0].accepted is not None  # llama-server's timings: per request, even in flight together


def test_a_server_that_takes_no_token_ids_is_sent_the_prompts_text(bundle, models):
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    tokenizer = load_tokenizer(path / "target")
    tokenize = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    standin = StandIn(engine_of(*models), text=tokenizer.decode, tokenize=tokenize)
    with serving(standin) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
    assert report.results[0].status == "pass" and "sent as text" in report.results[0].note, report.text()
    assert isinstance(standin.requests[0]["prompt"], list) and isinstance(standin.requests[1]["prompt"], str)


def test_a_request_that_takes_too_long_is_an_error_of_one_line(bundle):
    def slow(*args):  # answers after the client gave up: nothing to compute
        time.sleep(2)
        return [], 0, []

    with serving(StandIn(slow)) as url:
        report = verify_endpoint(url, bundle, timeout=0.5, progress=quiet)
    assert report.results[0].status == "error" and "did not answer in 0.5 s" in report.results[0].output


def test_the_timeout_is_a_deadline_for_the_whole_request_even_for_a_server_that_trickles(bundle, models):
    """A byte every 0.05 s keeps each read well within a per-read timeout of 0.5 s: --timeout bounds the whole
    request instead (connecting, then every byte), for the model list, a completion and a streamed one."""
    standin = StandIn(engine_of(*models))
    with serving(standin) as url:
        standin.trickle = 0.05
        with pytest.raises(EndpointError, match=r"/v1/models did not answer in 0\.5 s"):
            Endpoint(url, timeout=0.5)
        standin.trickle = 0.0
        endpoint = Endpoint(url, timeout=0.5)
        standin.trickle = 0.05
        with pytest.raises(EndpointError, match=r"/v1/completions did not answer in 0\.5 s"):
            endpoint.complete([1, 2, 3], 4)
        streamed = endpoint.stream([1, 2, 3], 4)
        streamed.join(timeout=120)  # a hang, not a time, is what this limit catches
        assert "did not finish streaming in 0.5 s" in str(streamed.error) and streamed.completion is None


def test_https_on_a_plain_http_server_is_said_so(bundle, models):
    """OpenSSL's "[SSL: WRONG_VERSION_NUMBER]" names no cause a person knows: the server does not speak TLS."""
    with serving(StandIn(engine_of(*models))) as url:
        secure = "https://" + url.removeprefix("http://")
        with pytest.raises(EndpointError) as e:
            Endpoint(secure)
    assert str(e.value).startswith(f"{secure} does not speak TLS (https): it answered as a plain-HTTP server; try "
                                   f"{url} (")  # fmt: skip


def test_a_url_with_the_apis_route_is_taken_and_a_404_says_its_route_in_a_short_plain_line(bundle, models):
    """…/v1/completions copied from a client's settings was asked …/v1/completions/v1/models; a 404 page of HTML was
    said whole, markup and all."""
    standin = StandIn(engine_of(*models))
    standin.html_404 = True
    with serving(standin) as url:
        for given in (url + "/v1/completions", url + "/v1/", url + "/v1/models"):
            assert Endpoint(given).url == url
        with pytest.raises(EndpointError) as e:
            Endpoint(url + "/llm")
    said = str(e.value)
    assert said.startswith(
        f"{url}/llm/v1/models answered 404 Not Found (no such route there: give the server's base URL, e.g. "
        "http://host:8000): 404 Not Found Not Found The requested URL was not found."
    )
    assert "<" not in said and "color" not in said and len(said.split("): ", 1)[1]) <= 160, said


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "soon"])
def test_a_timeout_that_is_no_finite_number_of_seconds_is_a_usage_error(bundle, capsys, value):
    """--timeout nan went to the socket, whose ValueError was said as the server's failure."""
    from dflash_ref.__main__ import main

    for mode in (["--endpoint", "http://127.0.0.1:9", "--bundle", str(bundle)], ["--impl", "reference"]):
        with pytest.raises(SystemExit) as e:
            main(["verify", *mode, "--timeout", value])
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and "argument --timeout:" in said and "seconds" in said, said


def twins(tmp_path):
    """A tiny target whose lm_head holds two rows 1e-4 apart (relative) for the token its greedy decoding takes
    first: a numeric tie at bfloat16's resolution (2⁻⁸ relative and more), not at float32's (2⁻²³)."""
    target, draft = make_pair(3, draft_overrides={"num_hidden_layers": 1})
    prompt = [1, 2, 3]
    first = int(target(torch.tensor([prompt])).logits[0, -1].argmax())
    twin = next(t for t in range(target.config.vocab_size - 1) if t != first)
    with torch.no_grad():
        z = target(torch.tensor([prompt])).logits[0, -1]
        target.lm_head.weight[twin] = target.lm_head.weight[first] * (1 - 1e-4 * (1 if z[first] > 0 else -1))
    save_target(target, tmp_path / "target")
    save_draft(draft, tmp_path / "draft")
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt_ids": prompt, "max_tokens": 6}) + "\n")
    return target, draft, first, twin


def tie_breaking_engine(target, first: int, twin: int):
    """Greedy decoding that takes `twin` where it is within 1e-3 of the top logit: an engine whose rounding breaks
    the tie the other way."""

    def engine(prompt, max_tokens, stops, body=None):
        ids = []
        for _ in range(max_tokens):
            z = target(torch.tensor([prompt + ids])).logits[0, -1]
            top = int(z.argmax())
            ids.append(twin if top == first and abs(z[first] - z[twin]) <= 1e-3 * abs(z[first]) else top)
        return ids, 0, []

    return engine


def test_a_divergence_at_a_numeric_tie_is_a_tie_in_bfloat16_and_a_fail_in_float32(tmp_path):
    target, draft, first, twin = twins(tmp_path)
    folders = dict(target=tmp_path / "target", draft=tmp_path / "draft", prompts=tmp_path / "prompts.jsonl")
    with serving(StandIn(tie_breaking_engine(target, first, twin), "llamacpp")) as url:
        bf16 = verify_endpoint(url, **folders, dtype="bfloat16", progress=quiet)
        fp32 = verify_endpoint(url, **folders, dtype="float32", progress=quiet)
    (tie,), (fail,) = bf16.results, fp32.results
    assert tie.status == "tie" and tie.divergences[0].token == twin and tie.divergences[0].top == first, bf16.text()
    d = tie.divergences[0]
    assert d.margin < d.resolution == resolution(d.scale, "bfloat16") and "a tie" in tie.output
    assert fail.status == "FAIL" and "beyond its measured drift" in fail.output  # float32 drifts far less
    assert bf16.passed() and not bf16.passed(strict=True) and not fp32.passed()


def test_a_file_of_outputs_is_judged_with_no_server(tmp_path):
    target, _, first, twin = twins(tmp_path)
    engine = tie_breaking_engine(target, first, twin)
    ids, _, _ = engine([1, 2, 3], 5, [], {})
    wrong = list(ids)
    wrong[3] = (wrong[3] + 2) % 11
    lines = [{"prompt_ids": [1, 2, 3], "output_ids": ids, "name": "tied"},
             {"prompt_ids": [1, 2, 3], "output_ids": wrong[:4], "logprobs": [-0.1] * 4, "name": "wrong"}]  # fmt: skip
    path = tmp_path / "outputs.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = verify_outputs(path, tmp_path / "target", "bfloat16", progress=quiet)
    tied, bad = report.results
    assert tied.status == "tie" and bad.status == "FAIL", report.text()
    assert bad.divergences[-1].index == 3 and "its own logprob" in bad.note
    path.write_text('{"prompt_ids": [1], "output_ids": [99]}\n')
    with pytest.raises(LineError, match="line 1: token id 99 is outside the target's vocabulary of 12"):
        verify_outputs(path, tmp_path / "target", progress=quiet)


GOOD = {"prompt_ids": [1, 2, 3], "output_ids": [4, 5]}


@pytest.mark.parametrize(
    "bad, said",
    [
        (
            {**GOOD, "output_ids": [4] * 600},
            "prompt (3) + output (600) = 603 positions, past the target's max_position_embeddings 512",
        ),  # was a traceback from inside the target
        ({**GOOD, "name": {"a": 1}}, 'name must be a non-empty string, got {"a": 1}'),  # was a traceback
        (
            '{"prompt_ids": [1], "output_ids": [1], "x": ' + "[" * 100000 + "]" * 100000 + "}",
            "not JSON it can read (nested too deeply)",
        ),  # was a RecursionError
        ("not json", "not JSON (Expecting value at column 1)"),
        ({**GOOD, "output_ids": []}, "an empty output_ids: nothing to check"),  # was a pass
        ({**GOOD, "logprobs": "abc"}, 'logprobs must be a list of numbers, one per output token, got "abc"'),  # ignored
        ({**GOOD, "output_ids": [4, 5.5]}, "output_ids must be a list of token ids ≥ 0"),
        ({**GOOD, "output_ids": [4, 99]}, "token id 99 is outside the target's vocabulary of 12"),
    ],
)
def test_a_bad_line_of_outputs_refuses_the_file_in_one_line_naming_it_before_any_is_judged(tmp_path, capsys, bad, said):
    """Line 3 bad after two good ones: one line naming the file and line 3 (no usage block, no traceback), exit 2,
    and no line judged (none replayed, none of their verdicts thrown away)."""
    from dflash_ref.__main__ import main

    twins(tmp_path)
    path = tmp_path / "outputs.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in (GOOD, GOOD, bad)))
    with pytest.raises(SystemExit) as e:
        main(["verify", "--outputs", str(path), "--target", str(tmp_path / "target")])
    out, err = capsys.readouterr()
    prog = "python -m dflash_ref verify outputs"  # the mode's parser says it
    assert e.value.code == 2 and err == f"{prog}: error: --outputs {path}, line 3: {said}\n", err
    assert "replaying" not in out


@pytest.mark.parametrize(
    "line, said",
    [
        ({"prompt_ids": [1] * 510}, "prompt (510) + max_new_tokens (4) = 514 exceeds the position limit"),
        ({"prompt_ids": [1, 99]}, "prompt token ids must lie in 0..11"),  # were said without their line, after usage
        ({"prompt_ids": [1, 2.5]}, "prompt_ids must be a non-empty list of token ids ≥ 0"),
        ({"prompt_ids": [1], "name": {"a": 1}}, 'name must be a non-empty string, got {"a": 1}'),
        ('{"prompt_ids": [' + "[" * 100000, "not JSON it can read (nested too deeply)"),
    ],
)
def test_a_bad_line_of_prompts_is_one_line_naming_it_before_any_request_is_sent(tmp_path, capsys, line, said):
    from dflash_ref.__main__ import main

    target, draft, *_ = twins(tmp_path)
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1, 2, 3]}) + "\n" + (line if isinstance(line, str) else json.dumps(line))
                    + "\n")  # fmt: skip
    standin = StandIn(engine_of(target, draft))
    with serving(standin) as url, pytest.raises(SystemExit) as e:
        main(["verify", "--endpoint", url, "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
              "--prompts", str(path), "--max-new-tokens", "4"])  # fmt: skip
    err = capsys.readouterr().err
    prog = "python -m dflash_ref verify endpoint"  # the mode's parser says it
    assert e.value.code == 2 and err.startswith(f"{prog}: error: --prompts {path}, line 2: {said}")
    assert err.count("\n") == 1 and standin.requests == []


def test_an_empty_serving_condition_is_a_usage_error_not_alone(tmp_path, capsys):
    from dflash_ref.__main__ import main

    for given in (",", "alone,", "alone,,repeat"):
        with pytest.raises(SystemExit) as e:
            main(["verify", "--endpoint", "http://127.0.0.1:9", "--target", "T", "--draft", "D", "--prompts", "P",
                  "--serving", given])  # fmt: skip
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and f"--serving {given!r}: an empty condition name" in said, said


def test_serving_conditions_from_outside_hold_each_request_to_its_run_alone(tmp_path):
    target, draft, *_ = twins(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt_ids": [1, 2, 3], "max_tokens": 8}) + "\n" + json.dumps(
        {"prompt_ids": [4, 5], "max_tokens": 8}) + "\n")  # fmt: skip
    standin = StandIn(engine_of(target, draft))
    standin.delay = 0.05  # seconds a token: p0 still streams when p1's first tokens come
    with serving(standin) as url:
        report = verify_endpoint(
            url, target=tmp_path / "target", draft=tmp_path / "draft", prompts=prompts,
            conditions=["alone", "repeat", "shared-prefix", "concurrent"], progress=quiet,
        )  # fmt: skip
    names = [r.request.name for r in report.results]
    assert names == ["p0", "p1", "p0.8.first", "p0.8.again", "p1.8.first", "p1.8.again", "p0.8.head", "p0.8+p1",
                     "p0.concurrent", "p1.concurrent"]  # fmt: skip
    assert all(r.status == "pass" for r in report.results), report.text()
    assert standin.requests[7]["prompt"] == [4, 5, 4, 5, 4, 1, 2, 3, 4, 5]  # lengthened to two of its KV blocks
    assert standin.requests[-1].get("stream") and report.shared and not report.shared[0].failed
    assert report.shared[0].names == ["p0.concurrent", "p1.concurrent"]
    seen = {r.request.name: (r.exercised, r.condition) for r in report.results if r.condition}
    assert seen["p0.8.again"][0] and "4 of 8 prompt tokens hit its prefix cache" in seen["p0.8.again"][1]
    assert seen["p0.concurrent"][0] and "streamed while p1.concurrent did too" in seen["p0.concurrent"][1]
    assert "prefix-cache hit: confirmed on 3 of 3 requests" in report.text(), report.text()


def test_a_condition_that_did_not_happen_is_said_not_exercised_and_a_bug_it_hides_shows_once_it_does(
    bundle, models, tmp_path
):
    """A serving bug that loses the draft's acceptance on a prefix-cache hit alone: sent as the kit sends a repeat
    (lengthened to two of the server's KV blocks), the hit happens, the server's own counters confirm it, and the
    acceptance shows the bug; a long prompt the server prefills in one step is said not to be a chunked prefill."""
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    prompt = [int(t) for t in find_bundles(path)[0].inputs["input_ids"]]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt_ids": prompt, "max_tokens": 12}) + "\n")
    folders = dict(target=path / "target", draft=path / "draft", prompts=prompts, progress=quiet)

    def hit_loses_the_draft(prompt, max_tokens, stops, body=None):  # the same output, nothing accepted
        ids, _, steps = engine_of(*models)(prompt, max_tokens, stops, body)
        return ids, 0, [0] * len(steps)

    standin = StandIn(engine_of(*models))
    standin.on_hit, standin.kv_block = hit_loses_the_draft, 4
    with serving(standin) as url:
        report = verify_endpoint(url, **folders, conditions=["repeat"])
    first, again = report.results
    assert first.status == "pass" and not first.condition, report.text()
    assert again.exercised and again.status == "FAIL" and "the draft saw another context" in again.acceptance
    assert len(again.request.prompt_ids) >= 8  # two blocks of 4 at least
    folders["prompts"] = tmp_path / "long.jsonl"
    folders["prompts"].write_text(json.dumps({"prompt_ids": prompt, "max_tokens": 4}) + "\n")
    sent, reports = dict(conditions=["long"], long=100), []
    for budget in (None, 40):  # tokens a step: any prompt in one, or 40 (each server's cache empty)
        standin = StandIn(engine_of(*models))
        standin.budget = budget
        with serving(standin) as url:
            reports.append(verify_endpoint(url, **{**folders, **sent}))
    whole, chunked = reports
    (one,), (many,) = whole.results, chunked.results
    assert one.exercised is False and "not exercised" in one.condition and one.status == "pass", whole.text()
    assert "chunked prefill: not exercised on 1" in whole.text()
    assert many.exercised and "prefilled in" in many.condition, chunked.text()


@pytest.mark.parametrize(
    "how, said",
    [
        ("refuse", "answered 400 Bad Request: maximum context length is 8 tokens"),
        ("break", "answered 500"),
        ("model", "does not serve the model 'other'"),
    ],
)
def test_a_server_that_refuses_or_fails_is_one_line(bundle, models, how, said):
    standin = StandIn(engine_of(*models), context=8 if how == "refuse" else 4096)
    if how == "break":
        standin.fail_with = (500, "CUDA error: out of memory")
    with serving(standin) as url:
        if how == "model":
            with pytest.raises(EndpointError, match=said):
                verify_endpoint(url, bundle, model="other", progress=quiet)
            return
        report = verify_endpoint(url, bundle, progress=quiet)
    (result,) = report.results
    assert said in result.output and result.status == ("n/a" if how == "refuse" else "error")
    assert not report.passed()


def run_cli(*args, timeout=600):
    """`python -m dflash_ref verify ARGS`, the command itself in a subprocess: its exit status, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "dflash_ref", "verify", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def run_main(*args) -> subprocess.CompletedProcess:
    """`verify ARGS` by the command's main in this process (a subprocess pays a torch import each time): its exit
    status, stdout and stderr as the interpreter would make them of its return or SystemExit (a message: said on
    stderr, status 1)."""
    from dflash_ref.__main__ import main

    argv = ["verify", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    return subprocess.CompletedProcess(argv, code or 0, out.getvalue(), err.getvalue())


def test_the_command_line_says_each_bad_input_in_one_line(tmp_path, bundle):
    unreachable = run_cli("--endpoint", "http://127.0.0.1:9", "--bundle", bundle)  # the one real subprocess
    assert unreachable.returncode == 1 and "is unreachable" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    not_a_url = run_main("--endpoint", "localhost:8000", "--bundle", bundle)
    assert not_a_url.returncode == 1 and "is not an http:// or https:// URL" in not_a_url.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "  "}\n')
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    folders = ["--target", tmp_path / "target", "--draft", tmp_path / "nope", "--prompts", prompts]
    empty = run_main("--endpoint", "http://127.0.0.1:9", *folders)
    assert empty.returncode == 2 and "line 1: an empty prompt" in empty.stderr
    prompts.write_text("hello\n")
    missing = run_main("--endpoint", "http://127.0.0.1:9", *folders)
    assert missing.returncode == 2 and "--draft no folder" in missing.stderr
    device = run_main("--endpoint", "http://127.0.0.1:9", "--bundle", bundle, "--device", "gpu")
    assert device.returncode == 2 and "--device: unknown device 'gpu'" in device.stderr
    lonely = run_main("--impl", "reference", "--prompts", prompts)
    assert lonely.returncode == 2 and "--prompts goes with verify endpoint, not verify impl" in lonely.stderr


def test_the_protocols_fields_are_read_where_each_engine_puts_them():
    vllm = parse_completion({"choices": [{"text": "ab", "token_ids": [5, 6], "finish_reason": "length"}],
                             "usage": {"prompt_tokens_details": {"cached_tokens": 32}}}, "x")  # fmt: skip
    assert vllm.output_ids == [5, 6] and vllm.accepted is None and vllm.cached == 32
    llama = parse_completion({"choices": [{"text": "ab", "logprobs": {"content": [{"id": 5, "logprob": -1.0}]}}],
                              "timings": {"draft_n": 6, "draft_n_accepted": 4}}, "x")  # fmt: skip
    assert llama.output_ids == [5] and llama.accepted == 4 and llama.logprobs == [-1.0]
    meta = {"completion_tokens": 9, "spec_verify_ct": 3}  # SGLang: x_0, then 3 verifies of τ + 1 tokens
    sglang = parse_completion({"choices": [{"text": "ab"}], "meta_info": meta}, "x")
    assert sglang.output_ids is None and sglang.accepted == 5
    counters = parse_counters(
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 7.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 2.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 3.0\n# a comment\n'
    )
    assert counters == {"accepted": 9.0, "accepted_per_pos.1": 3.0}
    assert parse_counters("other_metric 1\n") is None
    with pytest.raises(EndpointError, match="answered no choices"):
        parse_completion({"error": "x"}, "x")


@pytest.mark.parametrize(
    "choice, said",
    [
        ({"token_ids": [5, 6.7]}, "a token id that is not a whole number ≥ 0: 6.7"),  # was read as 6
        ({"token_ids": [5.0]}, "a token id that is not a whole number ≥ 0: 5.0"),
        ({"token_ids": "5 6"}, "token_ids that are no list"),
        ({"logprobs": {"content": [{"id": 2.5, "logprob": -1.0}]}}, "a token id that is not a whole number ≥ 0: 2.5"),
        ({"token_ids": [5], "logprobs": "abc"}, 'logprobs that are no object: "abc"'),  # was ignored
        ({"token_ids": [5], "logprobs": {"content": "abc"}}, "logprobs.content that is no list of objects"),
        ({"logprobs": {"content": [{"id": 5, "logprob": "abc"}]}}, 'a logprob that is no number: "abc"'),
        ({"token_ids": [5], "logprobs": {"token_logprobs": "abc"}}, "logprobs.token_logprobs that are no list"),
    ],
)
def test_an_answer_not_the_protocols_is_malformed_never_rounded_or_ignored(choice, said):
    with pytest.raises(EndpointError, match=re.escape(f"x answered {said}")):
        parse_completion({"choices": [{"text": "ab", **choice}]}, "x")
    with pytest.raises(EndpointError, match="draft_n_accepted that is not a whole number"):
        parse_completion({"choices": [{"text": "a", "token_ids": [5]}], "timings": {"draft_n_accepted": 1.5}}, "x")


def test_a_server_output_past_the_targets_positions_is_a_fail_not_a_traceback(bundle, models):
    def endless(prompt, max_tokens, stops, body):  # far past max_tokens, and past the target's 128 positions
        ids, accepted, steps = engine_of(*models)(prompt, max_tokens, stops)
        return ids + [1] * 200, accepted, steps

    with serving(StandIn(endless)) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
    (result,) = report.results
    assert result.status == "FAIL" and "past the target's max_position_embeddings 128" in result.output, report.text()


def test_a_server_answering_float_ids_is_an_error_not_a_pass(bundle, models):
    def floats(prompt, max_tokens, stops, body):  # the reference's ids, as JSON floats
        ids, accepted, steps = engine_of(*models)(prompt, max_tokens, stops)
        return [t + 0.0 for t in ids], accepted, steps

    with serving(StandIn(floats)) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
    (result,) = report.results
    assert result.status == "error" and "not a whole number ≥ 0" in result.output and not report.passed()


def test_the_resolution_is_one_unit_in_the_last_place_of_the_engines_dtype():
    assert resolution(12.4, "bfloat16") == 2.0**-7 * 8  # |z| in [8, 16)
    assert resolution(1.0, "float16") == 2.0**-10
    assert resolution(-3.0, "float32") == 2.0**-23 * 2
    for dtype, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        x = torch.tensor(12.4, dtype=torch_dtype)
        assert float(torch.nextafter(x, torch.tensor(100.0, dtype=torch_dtype)) - x) == resolution(12.4, dtype)


def test_the_matrix_gives_a_servers_check_from_outside_its_endpoint_cell(tmp_path):
    from dflash_ref.__main__ import main

    matrix = tmp_path / "MATRIX.md"
    matrix.write_text("# Conformance matrix\n\n`python -m dflash_ref matrix --engines` on 2026-12-06.\n\n"
                      "## Serving conditions\n\n| port | one sequence | prefix-cache hit |\n|---|---|---|\n"
                      "| vllm | FAIL (6 of 6) | FAIL (3 of 3) |\n| llamacpp | pass | pass |\n")  # fmt: skip
    shipped = {"kind": "endpoint", "requests": [{"status": "pass"}, {"status": "pass"}],
               "shared": [{"names": ["a", "b"], "failed": True}]}  # fmt: skip
    fixed = {"header": ["endpoint http://h:8000 (vllm), …"], "requests": [{"status": "pass"}, {"status": "tie"}],
             "shared": []}  # a report from before they said their kind: read by its header  # fmt: skip
    for name, report in (("shipped", shipped), ("fixed", fixed)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    assert main(["matrix", "--out", str(matrix), "--merge", "--endpoint", f"vllm={tmp_path / 'shipped.json'}",
                 "--endpoint", f"vllm (k_norm fixed)={tmp_path / 'fixed.json'}"]) == 0  # fmt: skip
    rows = {line.split("|")[1].strip(): line for line in matrix.read_text().splitlines() if line.startswith("| ")}
    assert rows["port"] == "| port | one sequence | prefix-cache hit | endpoint |"
    assert rows["vllm"] == "| vllm | FAIL (6 of 6) | FAIL (3 of 3) | FAIL (2 of 2) |"
    assert (
        rows["vllm (k_norm fixed)"].endswith("| tie (1 of 2) |") and rows["llamacpp"] == "| llamacpp | pass | pass |  |"
    )
    with pytest.raises(SystemExit):
        main(["matrix", "--endpoint", "vllm=x.json"])  # no --out: said, nothing runs


def test_the_matrix_refuses_an_out_of_other_words_and_a_report_that_is_no_servers(tmp_path, capsys):
    """`matrix --merge --out notes.md` appended a matrix to the notes (and without --merge replaced them);
    `matrix --endpoint` took a verify --outputs report as a server's."""
    from dflash_ref.__main__ import main
    from dflash_ref.conformance.endpoint.report import EndpointReport

    notes = tmp_path / "notes.md"
    notes.write_text("# My notes\n\nimportant\n")
    for merging in (["--merge"], []):
        with pytest.raises(SystemExit) as e:
            main(["matrix", "--out", str(notes), *merging, "--ports", "reference"])
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and f"--out {notes} is there and is not a matrix this command wrote" in said, said
    assert notes.read_text() == "# My notes\n\nimportant\n"
    outputs = tmp_path / "outputs.json"
    outputs.write_text(EndpointReport(["outputs o.jsonl against target T"], [], kind="outputs").json())
    matrix = tmp_path / "MATRIX.md"
    with pytest.raises(SystemExit) as e:
        main(["matrix", "--out", str(matrix), "--merge", "--endpoint", f"vllm={outputs}"])
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"{outputs} is a report of verify --outputs (outputs a user had" in said, said
    assert not matrix.exists()
    served = tmp_path / "served.json"
    served.write_text(json.dumps({"kind": "endpoint", "requests": [{"status": "pass"}]}))
    assert main(["matrix", "--out", str(matrix), "--merge", "--endpoint", f"vllm={served}"]) == 0
    assert matrix.read_text().startswith("# Conformance matrix\n\n`python -m dflash_ref matrix --merge --endpoint")


def test_sampled_decoding_from_outside_is_held_to_the_exact_distribution(tmp_path):
    from dflash_ref.conformance.bundle import find_bundles
    from dflash_ref.conformance.exact import reference_sampler, write_sampling

    write_sampling(tmp_path / "sampling", 0, "sampling")
    (bundle,) = find_bundles(tmp_path)
    sample = reference_sampler(bundle)

    def seeded(prompt, max_tokens, stops, body):  # the reference's sampler, seeded by the request
        assert body["temperature"] == bundle.manifest["sampling"]["temperature"] and body["top_p"] == 1.0
        ids, tau = sample(body["seed"])
        return ids[len(prompt) :], tau, [tau]

    def greedy(prompt, max_tokens, stops, body):  # a server that ignores the temperature
        return seeded(prompt, max_tokens, stops, {**body, "seed": 0})

    for engine, passed in ((seeded, 0), (greedy, 1)):
        with serving(StandIn(engine)) as url:
            said = run_main("--sampling", "--endpoint", url, "--bundle", tmp_path, "--runs", 300)
        assert said.returncode == passed, said.stdout + said.stderr
        assert "outputs: chi-square" in said.stdout and "reports no first-step τ per request" in said.stdout


def test_the_acceptance_bounds_hold_whole_block_steps_exactly_and_leave_the_shortened_tail_open():
    # engine_multiround's run: 14 steps, 24 new tokens of 24, block 4; the 14th step has 2 tokens left (< 4)
    taus = [1, 0, 0, 0, 1, 0, 0, 0, 1, 3, 3, 0, 0, 1]
    exact, rest, steps = acceptance_parts(taus, 24, 4, 24)  # 3 tokens left at the 13th step: shortened from there
    assert exact == taus[:12] and rest == 2 + 3 and steps == 3  # what is left − 1, and a whole last block's γ
    assert accepted_bounds(taus, 24, 4, 24) == (9, 14)
    # a shortened block before the last: held exactly only up to it (τ = 0 there moves the end by one)
    assert acceptance_parts([3, 0, 0], 6, 4, 6) == ([3], 1 + 3, 2)
    # ended by a stop token, no block shortened: the last step adds up to max(τ, what it committed)
    assert accepted_bounds([2, 1, 3], 1 + 3 + 2 + 2, 4, 64) == (3, 6)
    assert accepted_bounds([2, 1, 3], 8) == (3, 6)  # without the block: the same rule


def test_where_an_output_ends_is_judged_whatever_its_tokens():
    at, said = ending([5, 2, 7], 8, {2}, "length")
    assert at == 2 and said.startswith("went on past the stop token 2 at 1")
    assert ending([5, 6, 7], 2, {2}, "length") == (2, "returned 3 tokens, more than max_tokens 2")
    assert ending([5, 6], 8, {2}, "stop") == (2, "ended after 2 of 8 tokens at no stop token (finish_reason 'stop')")
    assert ending([5, 6, 2], 8, {2}, "stop") == ending([5, 6, 7], 3, {2}, "length") == (None, "")


@pytest.mark.parametrize("how", ["left out", "past it", "early"])
def test_a_stop_token_left_out_is_the_protocols_way_and_one_run_past_is_a_fail(tmp_path, how):
    generate_golden(tmp_path, ["stop_inside"])
    (path,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    target, draft = load_target(path / "target", dtype=torch.float32), load_draft(path / "draft", torch.float32)
    (request,), _ = from_bundles(tmp_path)
    assert request.expected[-1] in request.stop_ids and len(request.expected) < request.max_new_tokens

    def engine(prompt, max_tokens, stops, body):
        ids, accepted, steps = engine_of(target, draft)(prompt, max_tokens, stops)
        if how == "left out":
            return ids[:-1], accepted, steps  # as stop strings are: finish_reason stop, the token not returned
        if how == "past it":
            return ids + ids[:2], accepted, steps
        return ids[:-2], accepted, steps

    standin = StandIn(engine)
    standin.finish_stop = how == "left out"  # it stopped on the stop token, and says so, leaving the token out
    with serving(standin) as url:
        report = verify_endpoint(url, tmp_path, progress=quiet)
    (result,) = report.results
    if how == "left out":
        assert result.status == "pass" and "stop token left out" in result.note, report.text()
    else:
        said = "went on past the stop token" if how == "past it" else "ended after"
        assert result.status == "FAIL" and said in result.output, report.text()


def test_a_folder_of_several_model_pairs_is_refused_unless_the_server_names_one(tmp_path):
    generate_golden(tmp_path, ["multiround", "stop_inside"])
    with pytest.raises(RequestsError, match="holds 2 model pairs and a server serves one"):
        from_bundles(tmp_path, ["some-model"])
    chosen = next(p for p in tmp_path.iterdir() if p.name.endswith("stop_inside"))
    requests, folder = from_bundles(tmp_path, [str(chosen / "target")])  # vLLM's model id: the path it serves
    assert [r.name for r in requests] == ["stop_inside"] and folder == chosen / "target"


def test_the_replay_computes_every_norm_in_float64():
    from dflash_ref.rmsnorm import RMSNorm

    target, _ = make_pair(3)
    target = target.double()
    norms = [m for m in target.modules() if isinstance(m, RMSNorm)]
    seen = []
    hooks = [m.register_forward_hook(lambda m, args, out: seen.append((m, args[0], out))) for m in norms]
    ids = torch.tensor([[1, 2, 3, 4]])

    def exact(m, x):  # w ⊙ x / rms(x), all in float64
        return m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps))

    target(ids)
    assert not all(torch.equal(out, exact(m, x)) for m, x, out in seen)  # float32 statistics, as transformers'
    seen.clear()
    with float64_norms(target):
        target(ids)
    assert len(seen) == len(norms) and all(torch.equal(out, exact(m, x)) for m, x, out in seen)
    for h in hooks:
        h.remove()
    assert all("forward" not in vars(m) for m in norms)  # restored after


def test_the_outputs_command_exits_by_its_verdict(tmp_path):
    target, _, first, twin = twins(tmp_path)
    ids, _, _ = tie_breaking_engine(target, first, twin)([1, 2, 3], 5, [], {})
    path = tmp_path / "outputs.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1, 2, 3], "output_ids": ids}) + "\n")
    for flags, code in ((["--dtype", "bfloat16"], 0), (["--dtype", "bfloat16", "--strict"], 1), ([], 1)):
        said = run_main("--outputs", path, "--target", tmp_path / "target", *flags)
        assert said.returncode == code, said.stdout + said.stderr
    path.write_text('{"prompt_ids": [1], "output_ids": [1], "max_tokens": "many"}\n')
    said = run_main("--outputs", path, "--target", tmp_path / "target")
    assert said.returncode == 2 and "max_tokens must be a whole number" in said.stderr


def test_each_serving_condition_sends_the_prompts_as_its_threads_describe():
    from dflash_ref.conformance.endpoint.expected import with_conditions

    prompts = [{"name": "a", "prompt_ids": [1, 2], "max_tokens": 4}, {"name": "b", "prompt_ids": [3], "max_tokens": 4}]
    sent = with_conditions(prompts, ["alone", "repeat", "shared-prefix", "long", "concurrent"], long=7, block=2)
    by_name = {p["name"]: p for p in sent}
    assert list(by_name) == ["a", "b", "a.4.first", "a.4.again", "b.4.first", "b.4.again", "a.4.head", "a.4+b", "long7",
                             "a.concurrent", "b.concurrent"]  # fmt: skip
    # a prefix to be cached spans two KV blocks: the shorter prompts lengthened in front with the others' tokens
    assert by_name["a.4.again"]["prompt_ids"] == [3, 3, 1, 2] and by_name["b.4.again"]["prompt_ids"] == [1, 2, 1, 3]
    assert by_name["a.4+b"]["prompt_ids"] == [3, 3, 1, 2, 3] and by_name["long7"]["prompt_ids"] == [1, 2, 3, 1, 2, 3, 1]
    hits = [p["name"] for p in sent if p["condition"] == "prefix-cache hit"]
    assert hits == ["a.4.again", "b.4.again", "a.4+b"] and by_name["a.4.first"]["condition"] == "one sequence"
    assert [p["condition"] for p in sent][-3:] == ["chunked prefill"] + ["arrivals mid-decode"] * 2
    assert by_name["b.concurrent"]["serving"]["arrive"] == {"after": "a.concurrent", "tokens": 2}
    assert by_name["a.concurrent"]["serving"]["arrive"] is None
    with pytest.raises(RequestsError, match="--serving sideways: choose from alone, repeat"):
        with_conditions(prompts, ["sideways"])


def full_pass_outputs(target, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Greedy outputs of `target`, each token from a full pass over the sequence (no cache): an engine whose sums run
    in another order than the reference's cached decoding."""
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(tokens):
                logits = target(torch.tensor([ids]), past_key_values=target.make_cache(), output_hidden_states=False)
                ids.append(int(logits.logits[0, -1].argmax()))
            outputs.append(ids[len(prompt) :])
    return outputs


def test_a_correct_bfloat16_engine_passes_and_one_with_its_rope_base_misread_fails_against_the_control(tmp_path):
    """The control (the target in bfloat16, cached) is what a correct engine's rounding does: an engine in bfloat16
    that sums in another order departs from the float64 argmax within the measured drift and about as often; one
    whose RoPE base is read as 10× smaller departs far more often, whatever each departure's margin."""
    from dflash_ref.rope import RotaryEmbedding

    target, draft = make_pair(3, {"num_hidden_layers": 4, "vocab_size": 64}, std=0.4)
    save_target(target, tmp_path / "target")
    bf16 = load_target(tmp_path / "target", dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 64, (4,), generator=g).tolist() for _ in range(8)]
    correct = full_pass_outputs(bf16, prompts, 24)
    for rope in (m for m in bf16.modules() if isinstance(m, RotaryEmbedding)):
        rope.rope_theta, rope._inv_freq = rope.rope_theta / 10, {}
    misread = full_pass_outputs(bf16, prompts, 24)
    verdicts = {}
    for name, outputs in (("correct", correct), ("misread", misread)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt_ids": p, "output_ids": o, "max_tokens": 24}) + "\n"
                                for p, o in zip(prompts, outputs)))  # fmt: skip
        verdicts[name] = verify_outputs(path, tmp_path / "target", "bfloat16", progress=quiet)
    good, bad = verdicts["correct"], verdicts["misread"]
    assert good.passed(), good.text()
    assert all(d.excused for r in good.results for d in r.divergences)
    assert "about as often as its dtype's rounding does" in good.held[1]
    assert not bad.passed() and sum(len(r.divergences) for r in bad.results) > 3 * good.held[2]["control"]["count"]
    assert bad.held[0] or any(r.status == "FAIL" for r in bad.results), bad.text()


def test_the_run_is_held_to_the_controls_rate_by_a_poisson_tail():
    from dflash_ref.conformance.endpoint.control import Departures, held_to_control, poisson_tail

    assert poisson_tail(0, 3.0) == 1.0 and abs(poisson_tail(1, 3.0) - (1 - math.exp(-3.0))) < 1e-12
    control = Departures("the control", positions=400, requests=8, departed=5, count=12)
    same = Departures("the server", positions=400, requests=8, departed=6, count=15)
    many = Departures("the server", positions=400, requests=8, departed=8, count=40)
    assert held_to_control(same, control)[0] is False and held_to_control(many, control)[0] is True
    assert "departs from the float64 argmax at 40 of 400 positions" in held_to_control(many, control)[1]


def test_a_departure_past_one_ulp_is_excused_within_its_measured_drift_only():
    from dflash_ref.conformance.endpoint.ties import Divergence

    def at(margin, drift):
        return Divergence(3, 7, 9, margin, 0.125, 12.0, "bfloat16", drift)

    assert at(0.1, None).tie and at(0.1, None).excused
    assert at(0.3, 0.4).drifted and "within its measured drift" in at(0.3, 0.4).said()
    assert not at(0.5, 0.4).excused and "beyond its measured drift" in at(0.5, 0.4).said()
    assert not at(0.5, None).excused and "not a tie" in at(0.5, None).said()


def probing_standin(models, tokenizer, flavor: str = "vllm") -> StandIn:
    """A stand-in whose texts are the target tokenizer's, its special tokens left out unless asked: the probes of the
    API's fields can hold its texts to the reference's."""
    standin = StandIn(engine_of(*models), flavor, text=tokenizer.decode)
    standin.specials = set(tokenizer.all_special_ids)
    return standin


def test_the_apis_fields_on_the_speculative_route_are_held_to_the_protocol_and_named_where_wrong(bundle, models):
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    tokenizer = load_tokenizer(path / "target")
    with serving(probing_standin(models, tokenizer)) as url:
        good = verify_endpoint(url, bundle, progress=quiet)
    fields = [p.field for p in good.probes]
    for asked in ("max_tokens", "stop", "n 2", "echo", "seed 1234"):
        assert any(f.startswith(asked) for f in fields), (asked, good.text())
    assert good.passed() and all(p.status == "pass" for p in good.probes), good.text()
    ignoring = probing_standin(models, tokenizer)
    ignoring.ignores_stop = True  # its speculative route matches no stop string
    with serving(ignoring) as url:
        bad = verify_endpoint(url, bundle, progress=quiet)
    stops = [p for p in bad.probes if p.field.startswith("stop")]
    assert stops and all(p.status == "FAIL" and "where the reference's output gives" in p.said for p in stops)
    assert not bad.passed() and "the API's fields on the speculative route:" in bad.text()


def test_a_finish_reason_of_stop_for_an_output_cut_by_max_tokens_is_a_fail_naming_the_field(bundle, models):
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    standin = probing_standin(models, load_tokenizer(path / "target"))
    standin.finish_stop = True  # "stop" whatever ended the output
    with serving(standin) as url:
        report = verify_endpoint(url, bundle, progress=quiet)
    (result,) = report.results
    assert result.request.expected[-1] not in result.request.stop_ids  # max_tokens cut it
    assert result.status == "FAIL" and "finish_reason 'stop' where max_tokens cut it" in result.output, report.text()


def test_a_plain_route_holds_the_speculative_routes_fields_and_a_text_without_special_tokens_is_named(bundle, models):
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    tokenizer = load_tokenizer(path / "target")
    speculative, plain = probing_standin(models, tokenizer), probing_standin(models, tokenizer)
    speculative.ignores_stop = True
    with serving(speculative) as url, serving(plain) as plain_url:
        report = verify_endpoint(url, bundle, progress=quiet, plain=plain_url)
    stops = [p for p in report.probes if p.field.startswith("stop")]
    assert stops and all("against the plain route's" in p.said and p.status == "FAIL" for p in stops), report.text()
    # a text-only server whose text is the reference's but for its special tokens: named, and the rest compared
    (result,) = report.results
    text_only = StandIn(engine_of(*models), "plain", text=tokenizer.decode)
    text_only.specials = set(tokenizer.all_special_ids)
    if set(result.request.expected) & text_only.specials:
        with serving(text_only) as url:
            said = verify_endpoint(url, bundle, progress=quiet, outputs_only=True)
        assert said.results[0].status == "pass" and "leaves out the output's special tokens" in said.results[0].note


def test_logprobs_on_the_speculative_route_are_held_to_the_targets(bundle, models):
    (path,) = [p for p in bundle.iterdir() if p.is_dir()]
    target = models[0]
    prompt = [int(t) for t in find_bundles(path)[0].inputs["input_ids"]]

    def targets(ids):  # the target's own log-probability of each output token (float32, as an engine gives it)
        with torch.no_grad():
            z = target(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
        return z.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()

    reports = {}
    for name, given in (("the target's", targets), ("constant", lambda ids: [-0.1] * len(ids))):
        standin = StandIn(engine_of(*models), "llamacpp")
        standin.logprob_of = given
        with serving(standin) as url:
            reports[name] = verify_endpoint(url, bundle, progress=quiet)
    assert reports["the target's"].results[0].status == "pass", reports["the target's"].text()
    (wrong,) = reports["constant"].results
    assert wrong.status == "FAIL" and "logprobs: at 0 its logprob -0.1" in wrong.output, reports["constant"].text()
