"""The catalogue of causes (conformance/causes/): every catalogued mis-implementation, run as a port, is named by the
diagnosis; a correct port gets no finding; a cause left out of the catalogue is said to be unexplained, never
passed off as another; and verify's hint says what the diagnosis found."""

from __future__ import annotations

import dataclasses

import pytest

from dflash_ref.conformance.bundle import find_bundles
from dflash_ref.conformance.causes.catalogue import BY_NAME, CATALOGUE
from dflash_ref.conformance.causes.diagnose import explain
from dflash_ref.conformance.causes.measure import AsPort
from dflash_ref.conformance.golden import write_scenario
from dflash_ref.conformance.judge import compare
from dflash_ref.conformance.ports.reference import ReferenceAdapter
from dflash_ref.conformance.scenarios import SCENARIOS
from dflash_ref.conformance.verify import verify
from dflash_ref.rope import RotaryEmbedding

pytestmark = pytest.mark.usefixtures("one_thread_module")


@pytest.fixture(scope="module")
def bundles(golden, tmp_path_factory) -> dict:
    """The golden bundles (conftest's, written once per worker), by name; long_context's stand-in, the walkthrough
    with θ = 10⁶: what the causes shown there need of it is θ ≠ 10⁴, and its 4100-token prompt costs seconds a run
    where the walkthrough's costs a tenth of one."""
    walkthrough = next(s for s in SCENARIOS if s.name == "walkthrough")

    def build():
        target, draft = walkthrough.build()
        for model in (target, draft):
            model.config.rope_theta = 1e6
            model.rotary_emb = RotaryEmbedding(model.rotary_emb.head_dim, 1e6, model.rotary_emb.scaling)
        return target, draft

    folder = tmp_path_factory.mktemp("theta") / "walkthrough_theta"
    write_scenario(dataclasses.replace(walkthrough, name="walkthrough_theta", build=build), folder)
    return {**{b.name: b for b in find_bundles(golden)}, "long_context": find_bundles(folder)[0]}


def test_every_cause_names_a_stage_and_a_scenario():
    from dflash_ref.conformance.stages import STAGE_INDEX

    assert len(BY_NAME) == len(CATALOGUE), "two causes share a name"
    for cause in CATALOGUE:
        assert all(s in STAGE_INDEX for s in cause.stages), cause.name
        assert cause.says and not cause.says.endswith("."), cause.name


@pytest.mark.parametrize("name", [c.name for c in CATALOGUE])
def test_each_cause_run_as_a_port_is_named(bundles, name):
    """The catalogue's own test: the cause first shows at one of its stages on its scenario, and the diagnosis
    names it (with any cause that gives the very same tensors there)."""
    cause = BY_NAME[name]
    bundle = bundles[cause.shows_on]
    produced = AsPort(cause).run(bundle)
    checks = compare(bundle, produced)
    finding = explain(bundle, produced, checks)
    assert finding is not None, f"{name} does not show on {cause.shows_on}"
    first = next(c for c in checks if c.status == "FAIL" and c.kind == "semantic")
    assert first.stage in cause.stages or first.stage == "extra_step" and cause.stage == "output_ids", first.stage
    assert cause in finding.named, (finding.sentence(), first.hint)
    assert first.hint.startswith("reproduced by") and name in first.hint


def test_a_correct_port_gets_no_finding(bundles):
    bundle = bundles["walkthrough"]
    produced = ReferenceAdapter().run(bundle)
    assert explain(bundle, produced, compare(bundle, produced)) is None


@pytest.mark.parametrize("name", ["q-norm-skipped", "target-cache-not-cropped", "rope-interleaved-pairs"])
def test_a_cause_left_out_is_unexplained_not_misnamed(bundles, name):
    """Held out of the catalogue, a cause is "unexplained": no other cause is named for it."""
    cause = BY_NAME[name]
    bundle = bundles[cause.shows_on]
    produced = AsPort(cause).run(bundle)
    checks = compare(bundle, produced)
    from dflash_ref.conformance.causes.diagnose import diagnose

    first = next(c for c in checks if c.status == "FAIL" and c.kind == "semantic")
    finding = diagnose(bundle, produced, first, catalogue=[c for c in CATALOGUE if c is not cause])
    assert not finding.named and finding.tried, finding.sentence()
    assert finding.sentence().startswith("unexplained: none of the")


def test_verify_says_the_finding_and_can_leave_it_out(bundles):
    bundle = bundles["walkthrough"]
    cause = BY_NAME["attention-scale-1-over-d"]
    said = verify(AsPort(cause), bundle.path).first_failure.hint
    assert said.startswith("reproduced by the reference with attention-scale-1-over-d")
    plain = verify(AsPort(cause), bundle.path, diagnose=False).first_failure.hint
    assert "reproduced" not in plain and "unexplained" not in plain


class OneLayerShort(ReferenceAdapter):
    """A port that hands fc the features of one target layer where it takes k of them: its own line crashes."""

    name = "one-layer-short"

    def run(self, bundle):
        import torch
        from torch.nn import functional as F

        weight = torch.from_numpy(bundle.weights("draft")["fc.weight"])  # (d, k·d)
        target_hidden = torch.zeros(1, 3, weight.shape[0])  # (1, L_c, d): one layer's features
        return {"fc": F.linear(target_hidden, weight)}


def test_a_crash_says_which_values_the_port_held(bundles):
    report = verify(OneLayerShort(), bundles["walkthrough"].path)
    said = report.reason("walkthrough")
    assert "in the port at test_causes.py" in said
    assert "when the port fell over in run() it held target_hidden (1, 3, 8 = d" in said, said
    assert "16 = k·d (k = 2 target layers)" in said, said


def test_outputs_takes_the_x0_the_loop_committed():
    """A port that filters its output after the loop passes the x_0 its loop committed: its output's bug then
    shows at the output, not as a wrong x_0."""
    from dflash_ref.conformance.port import outputs
    from dflash_ref.conformance.stages import key_for

    assert int(outputs({}, [1, 2], [5, 6])[key_for("first_token")]) == 5
    assert int(outputs({}, [1, 2], [6], first_token=5)[key_for("first_token")]) == 5
    assert key_for("first_token") not in outputs({}, [1, 2], [])
