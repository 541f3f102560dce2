"""The fast CPU path's linear (fast_cpu/: linear.py, plan.py): every kernel is F.linear up to
float rounding, the plan is chosen by the clock (a fake one here: no timing is asserted), cached,
pinned by DFLASH_REF_LINEAR, and anything but an fp32 CPU product without grad goes to F.linear."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch
from conftest import make_pair
from torch.nn import functional as F

from dflash_ref.fast_cpu import linear, linear_product, plan, plan_store, use_fast_cpu
from dflash_ref.fast_cpu.plan import (
    COPIES,
    KERNELS,
    MODES,
    candidates,
    choose,
    kernel_for,
    linear_mode,
    linear_mode_as,
    measure,
    set_linear_mode,
)


@pytest.fixture(autouse=True)
def fresh_plans():
    """Each test starts with no measured plan and the environment's mode, and leaves it so."""
    plan.forget_plans()
    previous = set_linear_mode(None)
    yield
    plan.forget_plans()
    set_linear_mode(previous)


def fake_clock(seconds: dict[str, float], names: tuple[str, ...], weight: torch.Tensor, repeats: int = plan.REPEATS):
    """A clock for `measure`: each product of kernel `name` lasts seconds[name] (the kernels take
    turns product by product, `products_per_round` each per round, after a warm-up round)."""
    ticks, now = [], 0.0
    for _ in range((repeats + 1) * plan.products_per_round(weight)):
        for name in names:
            ticks += [now, now + seconds[name]]
            now += seconds[name]
    return iter(ticks).__next__


@pytest.mark.parametrize("d_out, d_in", [(40, 16), (24, 1537), (7, 769)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 64])
def test_every_kernel_is_f_linear_to_float_rounding(d_out, d_in, rows):
    """Each candidate, its parts made from W as a PlannedLinear makes them, gives F.linear's
    numbers up to fp32 rounding, contiguous (N, d_out)."""
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, d_in, generator=g), torch.randn(d_out, d_in, generator=g)
    expected = F.linear(x, w)
    for name in candidates(d_in, rows, with_copies=True):
        y = KERNELS[name](x, COPIES[name](w) if name in COPIES else [w])
        assert y.shape == (rows, d_out) and y.is_contiguous(), name
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-4, msg=name)
    assert candidates(d_in, rows, with_copies=False)[0] == "linear"
    assert ("sliced" in candidates(d_in, rows, True)) == (rows > 1 and d_in > plan.SPLIT_WIDTH)


def test_of_kernels_timed_alike_the_c_product_is_kept_before_torchs_other_products():
    """Within MARGIN of each other, the one first in the candidates' order stays (the order itself:
    tests/test_fast_cpu_streamed.py); a kernel clearly faster replaces it."""
    from dflash_ref.fast_cpu import streamed

    if not streamed.available():
        pytest.skip(f"no C product here: {streamed.status()}")
    for rows, other in ((1, "duplicated-row"), (4, "rows-first")):
        names = candidates(576, rows, with_copies=True)
        times = {name: [1.0] * 5 for name in names} | {"streamed": [0.5] * 5, other: [0.49] * 5}
        assert choose(times) == "streamed"  # 2 % faster is not clearly faster
        assert choose(times | {other: [0.45] * 5}) == other  # 10 % is
    assert "streamed" not in candidates(576, 1, True, d_out=plan.streamed.MAX_SIZE + 1)  # int sizes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 7, 16), (3, 2, 16), (5, 16), (16,), (1, 1, 16), (1, 65, 16)])
def test_linear_product_is_f_linear_to_float_rounding_under_every_plan(mode, shape):
    """Any leading shape, with and without a bias, through linear_product and a PlannedLinear:
    F.linear's numbers to rounding, contiguous; target.output_head (the proposals) is the lm_head."""
    g = torch.Generator().manual_seed(0)
    x, weight, bias = torch.randn(shape, generator=g), torch.randn(40, 16, generator=g), torch.randn(40, generator=g)
    layer = torch.nn.Linear(16, 40)
    use_fast_cpu(layer)
    with linear_mode_as(mode), torch.no_grad():
        out = linear_product(x, weight)
        assert out.shape == (*shape[:-1], 40) and out.is_contiguous()
        torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(linear_product(x, weight, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        target, _ = make_pair(0)
        h = torch.randn(1, 4, target.config.hidden_size, generator=g)
        torch.testing.assert_close(target.output_head(h), target.lm_head(h), rtol=1e-5, atol=1e-5)


def test_choose_keeps_f_linear_unless_another_is_clearly_faster():
    """A kernel replaces F.linear only if it is ≥ 5 % faster in the median pair of samples (i-th against
    i-th), and a later one (one that needs copies of W) replaces an earlier only if ≥ 5 % faster than it."""
    assert choose({"linear": [1.0, 1.0, 1.0], "rows-first": [0.96, 0.96, 0.96]}) == "linear"  # a tie
    assert choose({"linear": [1.0, 1.0, 1.0], "rows-first": [0.9, 0.9, 0.9]}) == "rows-first"
    assert choose({"linear": [1.0, 1.0, 1.0], "rows-first": [0.9, 0.8, 0.9], "sliced": [0.5, 0.5, 0.6]}) == "sliced"
    assert choose({"linear": [1.0, 1.0, 1.0], "transposed": [1.2, 1.3, 0.1]}) == "linear"  # one lucky sample
    assert choose({"linear": [1.0, 1.0, 3.0], "rows-first": [0.9, 0.9, 0.3]}) == "rows-first"  # one stall of linear
    # a quiet moment that speeds both up (the 4th pair) hides nothing: rows-first is 10 % faster in every
    # other pair (the fastest samples compared unpaired, 0.6 and 0.6, would call it a tie)
    assert choose({"linear": [1.0, 1.0, 1.0, 0.6], "rows-first": [0.9, 0.9, 0.9, 0.6]}) == "rows-first"
    # a slow minute for both: ratios, not times, are compared
    assert choose({"linear": [1.0, 3.0, 3.0], "rows-first": [1.0, 2.7, 2.7]}) == "rows-first"
    assert choose({"linear": [1.0], "rows-first": [0.8]}, margin=0.7) == "linear"
    assert choose({"linear": [1.0], "rows-first": [0.8], "transposed": [0.78]}) == "rows-first"  # no copy for 2 %
    assert choose({"linear": [1.0], "rows-first": [0.8], "transposed": [0.7]}) == "transposed"


@pytest.mark.parametrize("d_in", [16, 1537])
def test_a_measured_plan_follows_the_clock_once_per_shape_and_is_cached(d_in):
    """kernel_for times the candidates (interleaved, paired) with the clock it is given, keeps the
    fastest, and reads it from the cache afterwards; another row count or thread count is measured
    anew, and plans() reports what was measured."""
    weight = torch.randn(24, d_in)
    names = candidates(d_in, 3, with_copies=True)
    seconds = {name: 1.0 for name in names} | {names[-1]: 0.5}
    assert kernel_for(weight, 3, True, clock=fake_clock(seconds, names, weight)) == names[-1]

    def no_clock():
        raise AssertionError("measured again")

    assert kernel_for(weight, 3, True, clock=no_clock) == names[-1]  # cached
    with pytest.raises(AssertionError, match="measured again"):
        kernel_for(weight, 2, True, clock=no_clock)
    names_1 = candidates(d_in, 1, with_copies=False)
    assert kernel_for(weight, 1, False, clock=fake_clock(dict.fromkeys(names_1, 1.0), names_1, weight)) == "linear"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        with pytest.raises(AssertionError, match="measured again"):
            kernel_for(weight, 3, True, clock=no_clock)
    finally:
        torch.set_num_threads(threads)
    report = {(p["rows"], p["chosen"]) for p in plan.plans()}
    assert report == {(3, names[-1]), (1, "linear")}
    times = measure(weight, 3, names, clock=fake_clock(seconds, names, weight))
    per_round = plan.products_per_round(weight)
    assert all(len(t) == plan.REPEATS * per_round for t in times.values())
    assert times[names[-1]] == [0.5] * plan.REPEATS * per_round


def test_the_mode_pins_the_plan_and_a_bad_one_is_named(monkeypatch):
    """DFLASH_REF_LINEAR / set_linear_mode: linear and rows-first need no measurement; an unknown
    value is refused with the variable and the choices named."""
    weight = torch.randn(8, 4)

    def no_clock():
        raise AssertionError("measured")

    with linear_mode_as("linear"):
        assert [kernel_for(weight, r, True, clock=no_clock) for r in (1, 2)] == ["linear", "linear"]
    with linear_mode_as("rows-first"):
        assert [kernel_for(weight, r, True, clock=no_clock) for r in (1, 2)] == ["duplicated-row", "rows-first"]
    monkeypatch.setenv("DFLASH_REF_LINEAR", "rows-first")
    set_linear_mode(None)
    assert linear_mode() == "rows-first"
    monkeypatch.setenv("DFLASH_REF_LINEAR", "fastest")
    set_linear_mode(None)
    with (
        pytest.raises(
            ValueError,
            match=r"DFLASH_REF_LINEAR='fastest' is not a linear plan; choose one of "
            r"measured, linear, rows-first",
        ),
        torch.no_grad(),
    ):
        linear_product(torch.randn(2, 4), weight)
    with pytest.raises(ValueError, match="set_linear_mode='fast' is not a linear plan"):
        set_linear_mode("fast")
    monkeypatch.delenv("DFLASH_REF_LINEAR")
    set_linear_mode(None)
    assert linear_mode() == "measured"


def test_bf16_autocast_grad_many_rows_and_other_devices_go_to_f_linear(monkeypatch):
    """Nothing is measured, and the result is F.linear's exactly, for a bf16 product, one under
    autocast, in grad mode, for more than 64 rows, and on another device (meta here)."""
    monkeypatch.setattr(plan, "measure", lambda *a, **k: pytest.fail("measured"))
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(12, 8, generator=g), torch.randn(3, 8, generator=g)
    with torch.no_grad():
        assert torch.equal(linear_product(x.bfloat16(), w.bfloat16()), F.linear(x.bfloat16(), w.bfloat16()))
        assert torch.equal(linear_product(torch.randn(65, 8), w[:1] * 0), torch.zeros(65, 1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert linear_product(x, w).dtype == torch.bfloat16
        meta = linear_product(x.to("meta"), w.to("meta"))
        assert meta.device.type == "meta" and meta.shape == (3, 12)
    assert torch.equal(linear_product(x, w), F.linear(x, w))  # grad mode
    assert plan.plans() == []


@pytest.mark.parametrize(
    "kernel, d_in, pieces", [("sliced", 1536, 2), ("sliced", 1537, 3), ("sliced", 769, 2), ("transposed", 40, 1)]
)
def test_a_planned_linear_keeps_the_copies_its_kernel_reads(monkeypatch, kernel, d_in, pieces):
    """When the plan picks a kernel that reads copies of W, the layer makes them once (contiguous, W
    again when put together), reads them (zeroed copies give the bias alone), and remakes them after
    the weight changes in place, is loaded anew or replaced; a deep copy makes its own; grad mode
    and a weight made in inference mode or over MAX_COPY elements get none (F.linear then)."""
    monkeypatch.setattr(linear, "kernel_for", lambda weight, rows, with_copies: kernel if with_copies else "linear")
    g, rows = torch.Generator().manual_seed(d_in), 3
    layer = torch.nn.Linear(d_in, 24)
    use_fast_cpu(layer)
    x = torch.randn(1, rows, d_in, generator=g)
    with torch.no_grad():
        out = layer(x)
        torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4)
        made = layer.copies(kernel)
        assert len(made) == pieces and all(p.is_contiguous() for p in made)
        assert torch.equal(torch.cat(made, dim=1) if kernel == "sliced" else made[0].T, layer.weight)
        layer._copies_of_weight[kernel] = [torch.zeros_like(p) for p in made]  # read by the kernel
        torch.testing.assert_close(layer(x), layer.bias.expand(1, rows, 24))
        layer.forget_copies()
        layer.weight.mul_(2)  # in place: the copies follow
        layer(x)
        layer.weight.mul_(0.5)
        torch.testing.assert_close(layer(x), out, rtol=1e-5, atol=1e-4)
        layer.load_state_dict({"weight": torch.zeros(24, d_in), "bias": torch.ones(24)})
        assert torch.equal(layer(x), torch.ones(1, rows, 24))
        layer.weight = torch.nn.Parameter(torch.full((24, d_in), 0.5))  # replaced: the copies follow
        expected = (x.sum(-1, keepdim=True) / 2 + 1).expand(1, rows, 24)
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-4)
        twin = copy.deepcopy(layer)  # its own version count
        assert "_copies_of_weight" not in twin.__dict__
        twin.weight.mul_(3)
        torch.testing.assert_close(
            twin(x), (3 * x.sum(-1, keepdim=True) / 2 + 1).expand(1, rows, 24), rtol=1e-5, atol=1e-4
        )
        monkeypatch.setattr(linear, "MAX_COPY", 24 * d_in - 1)
        assert layer.copies(kernel) is None and not linear.can_copy(layer.weight)
    with torch.inference_mode():
        made_there = torch.nn.Linear(d_in, 24)  # no version count: no copies
        use_fast_cpu(made_there)
        assert made_there.copies(kernel) is None and made_there(x).shape == (1, rows, 24)
    assert layer.copies(kernel) is None  # grad mode


def test_grad_mode_takes_f_linear_so_gradients_reach_w_and_x():
    layer = torch.nn.Linear(1537, 24)
    use_fast_cpu(layer)
    reference = copy.deepcopy(layer)
    reference.__class__ = torch.nn.Linear
    x = torch.randn(1, 3, 1537, requires_grad=True)
    (layer(x) ** 2).sum().backward()
    x_grad, x.grad = x.grad, None
    (reference(x) ** 2).sum().backward()
    torch.testing.assert_close(layer.weight.grad, reference.weight.grad)
    torch.testing.assert_close(x_grad, x.grad)


def test_a_real_measurement_picks_a_candidate_and_every_plan_decodes_alike():
    """No timing asserted: a measured plan is one of the candidates, measuring leaves torch's random
    numbers alone, and greedy speculative output with a switched draft is the same under every plan
    (the products differ by rounding only)."""
    from dflash_ref import spec_generate

    weight = torch.randn(32, 16)
    torch.manual_seed(0)
    with torch.no_grad():
        for rows, with_copies in itertools.product((1, 4), (False, True)):
            assert kernel_for(weight, rows, with_copies) in candidates(16, rows, with_copies)
    drawn = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(drawn, torch.rand(3))  # measuring draws nothing: sampled decoding is unmoved
    target, draft = make_pair(3)
    use_fast_cpu(target), use_fast_cpu(draft)
    ids = torch.randint(0, 12, (1, 5), generator=torch.Generator().manual_seed(3))
    outputs = []
    for mode in MODES:
        with linear_mode_as(mode):
            outputs.append(spec_generate(draft, target, ids, 20).output_ids)
    assert all(torch.equal(o, outputs[0]) for o in outputs)


@pytest.fixture
def store(monkeypatch, tmp_path):
    """The plans' store in an empty cache folder of this test's own → its path."""
    monkeypatch.setenv("DFLASH_REF_CACHE", str(tmp_path / "cache"))
    plan.forget_plans()
    return plan_store.store_path()


def test_a_measured_plan_is_stored_and_a_later_process_reads_it_instead_of_measuring(monkeypatch, store):
    """The first product of a shape measures it and writes the plan to the store; a process starting
    afresh (forget_plans: nothing in memory) reads that plan back and measures nothing, and says so;
    forget_plans(stored=True) deletes the file."""
    weight = torch.randn(24, 16)
    chosen = kernel_for(weight, 3, False)
    entry = json.loads(store.read_text())["plans"][
        f"24×16 rows 3 no-copies torch.float32 threads {torch.get_num_threads()}"
    ]
    assert entry["chosen"] == chosen and tuple(entry["times"]) == candidates(16, 3, False)
    plan.forget_plans()
    monkeypatch.setattr(plan, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert kernel_for(weight, 3, False) == chosen
    assert [(p["rows"], p["chosen"], p["measured"]) for p in plan.plans()] == [(3, chosen, "earlier (stored)")]
    # a stored choice is re-decided from the stored samples by today's rule (choose)
    data = json.loads(store.read_text())
    entry = next(iter(data["plans"].values()))
    entry["times"] = {n: [1.0, 1.0, 1.0] for n in entry["times"]} | {"rows-first": [0.5, 0.5, 0.5]}
    entry["chosen"] = "linear"
    store.write_text(json.dumps(data))
    plan.forget_plans()
    assert kernel_for(weight, 3, False) == choose(entry["times"]) == "rows-first"
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        kernel_for(weight, 2, False)  # another row count: not in the store
    plan.forget_plans(stored=True)
    assert not store.exists()


@pytest.mark.parametrize(
    "damage",
    [
        "not json {",
        '{"plans": []}',
        "a kernel gone",
        "times not seconds",
        "chosen unknown",
        "a zero time",
        "unequal lengths",
    ],
)
def test_a_damaged_or_outdated_store_is_measured_again_and_rewritten(store, damage):
    """A store file that does not parse, or whose plan names candidates other than those measurable
    now (a C product built since, say) or holds no times, a zero time or lists of unequal lengths, is
    measured again, not trusted, and rewritten."""
    weight = torch.randn(24, 16)
    kernel_for(weight, 3, False)
    data = json.loads(store.read_text())
    name, entry = next(iter(data["plans"].items()))
    if damage == "a kernel gone":
        entry["times"].pop("rows-first")
    elif damage == "times not seconds":
        entry["times"]["linear"] = ["fast"]
    elif damage == "chosen unknown":
        entry["chosen"] = "mystery"
    elif damage == "a zero time":  # choose() divides by the chosen kernel's samples
        entry["times"]["linear"][0] = 0.0
    elif damage == "unequal lengths":  # choose() pairs the i-th samples
        entry["times"]["linear"].pop()
    store.write_text(damage if damage.startswith(("not", "{")) else json.dumps(data))
    plan.forget_plans()
    names = candidates(16, 3, False)
    measured = []
    real_measure = plan.measure

    def counted(*args, **kwargs):
        measured.append(args[1])
        return real_measure(*args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(plan, "measure", counted)
        assert kernel_for(weight, 3, False) in names
    assert measured == [3]
    rewritten = json.loads(store.read_text())["plans"][name]
    assert tuple(rewritten["times"]) == names and rewritten["chosen"] in names


def test_a_fake_clock_neither_reads_nor_writes_the_store_and_an_unwritable_cache_is_no_error(
    monkeypatch, store, tmp_path
):
    """A plan timed by a fake clock (tests) is measured even where the store holds one, and not written;
    a cache folder that cannot be made keeps measured plans for the process, without an error."""
    weight = torch.randn(24, 16)
    names = candidates(16, 3, False)
    kernel_for(weight, 3, False)  # a real plan in the store …
    data = json.loads(store.read_text())
    next(iter(data["plans"].values()))["chosen"] = "linear"  # … that says F.linear
    store.write_text(before := json.dumps(data))
    plan.forget_plans()
    seconds = {name: 1.0 for name in names} | {names[-1]: 0.5}
    assert kernel_for(weight, 3, False, clock=fake_clock(seconds, names, weight)) == names[-1]  # measured, not read
    assert store.read_text() == before  # and not written
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("DFLASH_REF_CACHE", str(blocked))  # the cache folder cannot be made
    plan.forget_plans()
    assert kernel_for(weight, 4, False) in candidates(16, 4, False)  # kept for this process only
    assert kernel_for(weight, 4, False, clock=lambda: pytest.fail("measured again")) in candidates(16, 4, False)


def test_a_weight_off_the_cpu_never_reaches_the_c_product(monkeypatch):
    """The C product reads W's memory as the CPU's: linear_product leaves any other device to F.linear
    (here the plan is made to answer the C product for every shape)."""
    monkeypatch.setattr(linear, "kernel_for", lambda *args, **kwargs: "streamed")
    x, w = torch.randn(1, 24), torch.empty(40, 24, device="meta")
    with torch.inference_mode():
        assert linear_product(x, w).device == F.linear(x, w).device


def test_a_pass_that_measures_plans_says_so_and_its_time_leaves_them_out(store, monkeypatch):
    """Stopwatch (bench.timing): the seconds that measuring and storing plans took inside a pass
    (plan.measuring_seconds) go to clock.planning, not to the pass's time; a later pass of the
    same shapes measures nothing. The planning is faked as 5 s, so that no timing is asserted."""
    from dflash_ref.bench.timing import Stopwatch

    layer = torch.nn.Linear(16, 24)
    use_fast_cpu(layer)
    real_measure = plan.measure

    def slow_measure(*args, **kwargs):  # a measurement that took 5 s more
        plan._spent[0] += 5.0
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(plan, "measure", slow_measure)
    spent = plan.measuring_seconds()
    clock = Stopwatch(layer)
    with torch.no_grad():
        layer(torch.randn(3, 16))
        planning = clock.planning
        layer(torch.randn(3, 16))
    clock.remove()
    assert planning == pytest.approx(plan.measuring_seconds() - spent) and planning > 5.0
    assert clock.planning == planning  # the second pass read the plan: nothing measured
    assert -5.0 < clock.times[0] < 0.0 <= clock.times[1]
