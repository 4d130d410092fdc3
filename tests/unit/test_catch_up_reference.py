"""What catch-up and stabilization are measured against after a scale: the level before the request, or the new
level the output settled at when the scale changed what a congested topology delivers (`core.rate_timeline.
recovery`), and how the follow-up, the scaling record and the controller's event say which."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_topology_controller import setup

from elastream.control.catch_up import CatchUpFollowUp
from elastream.control.scaling import ScalingRecord
from elastream.core.metrics import MetricSample
from elastream.core.outcomes import Direction
from elastream.core.rate_timeline import rate_timeline, recovery, recovery_times, reference_phrase
from support.fakes import ListFeed


def steps(*parts: tuple[int, float]) -> list[float]:
    """Per-point rates: (count, rate) runs one after the other."""
    return [rate for count, rate in parts for _ in range(count)]


def timeline(before: list[float], after: list[float]) -> list[tuple[float, float]]:
    """Points one second apart, `before` ending at -1 s and `after` starting at the request (0 s)."""
    return [(float(t - len(before)), rate) for t, rate in enumerate(before)] + [
        (float(t), rate) for t, rate in enumerate(after)
    ]


# the timelines the catch-up tests of test_migration_core read, with the arguments they read them with
UNCONGESTED = [
    ([(-2.0, 100.0), (-1.0, 100.0), (0.0, 0.0), (1.0, 20.0), (2.0, 180.0), (3.0, 120.0)], {}),
    ([(-2.0, 100.0), (-1.0, 100.0), (0.0, 0.0), (1.0, 20.0), (2.0, 180.0), (3.0, 120.0), (4.0, 105.0)], {}),
    ([(-1.0, 50.0), (0.0, 10.0), (1.0, 48.0), (2.0, 50.0)], {"hold": 2}),
    (
        [(-3.5, 600.0)]
        + [(t / 2.0, 200.0) for t in range(-6, 0)]
        + [(0.0, 200.0), (0.5, 0.0), (1.0, 250.0)]
        + [(1.5 + t / 2.0, 200.0) for t in range(10)],
        {"resumed_at": 0.5},
    ),
    (
        [(t / 2.0, 100.0) for t in range(-8, 5)]
        + [(2.5, 0.0), (3.0, 0.0), (3.5, 60.0)]
        + [(4.0 + t / 2.0, 100.0) for t in range(6)],
        {"resumed_at": 2.5},
    ),
    ([(0.0, 5.0)], {}),
]


@pytest.mark.parametrize(("output", "options"), UNCONGESTED)
def test_an_output_back_at_its_level_is_measured_against_the_level_before_as_today(
    output: list[tuple[float, float]], options: dict
) -> None:
    found = recovery(output, **options)
    assert (found.catch_up, found.stabilization) == recovery_times(output, **options)
    assert found.reference == "before"


def test_the_steady_output_of_the_migration_tests_is_final_against_the_level_before() -> None:
    found = recovery(timeline(steps((10, 100.0)), steps((2, 0.0), (8, 101.0))), resumed_at=1.0)
    assert (found.catch_up, found.stabilization) == (2.0, 2.0)
    assert found.reference == "before" and found.final
    assert found.level_before == 100.0 and found.level_after == 101.0


def test_a_noisy_output_back_at_the_old_level_is_final_as_soon_as_it_stays_in_its_band() -> None:
    # ±8 % around 1,000/s: the points do not agree within 10 % of each other, but they stay within ±10 % of
    # the level before, which is what the rule against it asks
    output = timeline(steps((10, 1000.0)), [0.0, 1080.0, 920.0, 1070.0, 930.0, 1060.0, 940.0])
    found = recovery(output)
    assert found.final and found.reference == "before"
    assert (found.catch_up, found.stabilization) == recovery_times(output) == (1.0, 1.0)


def test_a_congested_scale_out_is_measured_against_the_level_it_raised_the_output_to() -> None:
    # make demo on a busy machine: the sources offer 3,200/s, the sinks delivered 1,887/s, the scale-out
    # raised that to 2,833/s. Against the level before the output is never back within ±10 %: "not stable".
    output = timeline(steps((10, 1887.0)), [1887.0, 1887.0, 0.0, 2900.0, 2833.0, 2820.0, 2840.0, 2833.0, 2830.0])
    emitted = [(t, rate) for t, rate in output]  # the sources emit what the sinks deliver (selectivity 1)
    offered = [(t, 3200.0) for t, _ in output]
    assert recovery_times(output, resumed_at=2.0) == (3.0, None)
    found = recovery(output, resumed_at=2.0, emitted=emitted, offered=offered)
    assert found.reference == "newLevel" and found.final
    # the level is the median of the first four points in a row that agree (2,900, 2,833, 2,820, 2,840)
    assert found.level_before == 1887.0 and found.level_after == 2836.5
    assert (found.catch_up, found.stabilization) == (3.0, 3.0)
    assert found.congested_before is True
    # read again later with more output, the answer is the same
    later = output + [(float(t), rate) for t, rate in zip(range(9, 30), [2600.0, 3000.0] * 20, strict=False)]
    assert recovery(later, resumed_at=2.0, emitted=later, offered=[(t, 3200.0) for t, _ in later]) == found


def test_an_output_passing_through_the_old_level_on_its_way_up_is_not_stable_there() -> None:
    ramp = [0.0, 1800.0, 1900.0, 1950.0, 2400.0]
    settled = [2833.0, 2833.0, 2830.0, 2840.0, 2835.0]
    # the rule against the level before stops at 1,800 + 1,900 + 1,950 (within ±10 % of 1,887)
    early = timeline(steps((10, 1887.0)), [*ramp, 2600.0])
    assert recovery_times(early) == (1.0, 1.0)
    found = recovery(early)
    assert found.level_after is None and not found.final  # the follow-up keeps measuring
    found = recovery(timeline(steps((10, 1887.0)), ramp + settled))
    assert found.final and found.reference == "newLevel" and found.level_after == 2833.0
    assert (found.catch_up, found.stabilization) == (5.0, 5.0)  # 2,400 at 4 s is not yet 90 % of 2,833


def test_a_scale_in_that_lowers_capacity_is_measured_against_the_lower_level() -> None:
    # uncongested before (the sources emit all they are offered), congested after: 1,000/s down to 800/s
    output = timeline(steps((10, 1000.0)), [0.0, 850.0, 800.0, 790.0, 805.0, 800.0, 798.0])
    offered = [(t, 1000.0) for t, _ in output]
    assert recovery_times(output) == (None, None)
    found = recovery(output, emitted=output, offered=offered)
    assert found.reference == "newLevel" and found.final
    assert found.level_after == 802.5 and found.congested_before is False  # 850, 800, 790, 805
    assert (found.catch_up, found.stabilization) == (1.0, 1.0)
    assert "lowered the output from 1,000/s" in reference_phrase(found.reference, found.level_before, found.level_after)


def test_an_output_that_never_settles_is_not_stable() -> None:
    output = timeline(steps((10, 1000.0)), steps((1, 0.0)) + [500.0, 1500.0] * 8)
    found = recovery(output)
    assert found.stabilization is None and found.level_after is None and not found.final
    assert found.reference == "before"


def test_an_output_that_stops_is_not_a_new_level() -> None:
    found = recovery(timeline(steps((10, 1000.0)), steps((10, 0.0))))
    assert found.level_after is None and found.stabilization is None and found.reference == "before"


def test_a_backlog_worked_off_above_the_level_is_not_a_new_level_when_the_offered_rate_is_known() -> None:
    # uncongested: after the pause the sources work off what queued at 1,500/s, then emit the 1,000/s offered
    burst = timeline(steps((10, 1000.0)), steps((1, 0.0), (7, 1500.0)))
    offered = [(t, 1000.0) for t, _ in burst]
    found = recovery(burst, emitted=burst, offered=offered)
    assert found.level_after is None and not found.final and found.reference == "before"
    # without the offered rate the output alone reads the long burst as a level (said in `recovery`)
    assert recovery(burst).reference == "newLevel"
    back = timeline(steps((10, 1000.0)), steps((1, 0.0), (7, 1500.0), (5, 1000.0)))
    offered = [(t, 1000.0) for t, _ in back]
    found = recovery(back, emitted=back, offered=offered)
    assert found.final and found.reference == "before" and found.level_after == 1000.0
    assert (found.catch_up, found.stabilization) == recovery_times(back) == (1.0, 8.0)


def test_an_output_that_starts_after_the_request_is_measured_against_its_level() -> None:
    found = recovery([(t, 500.0) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)])
    assert found.reference == "newLevel" and found.level_before is None and found.stabilization == 0.0
    assert reference_phrase(found.reference, found.level_before, found.level_after) == (
        "the new level 500/s (no output before the request)"
    )


def test_the_reference_reads_as_a_user_would_say_it() -> None:
    assert reference_phrase("newLevel", 1887.0, 2833.0) == (
        "the new level 2,833/s (the scale raised the output from 1,887/s)"
    )
    assert reference_phrase("before", 1887.0, None) == "the level before, 1,887/s"
    assert reference_phrase(None, None, None) == "the level before"


def sample(ts: float, vertex: str, processed: float, received: float | None = None) -> MetricSample:
    count = round(processed)
    return MetricSample(ts, "node-0", vertex, f"{vertex}#0", 0.0, round(received or processed), count, count, 0.0, 0)


def congested_scale_out(end: int, at: float = 1000.0) -> list[MetricSample]:
    """A source offered 3,200/s whose topology delivers 1,887/s until the request at `at`, pauses three
    seconds, then delivers 2,833/s: one sample a second up to `end` seconds after the request."""
    samples, emitted, offered = [], 0.0, 0.0
    for k in range(-15, end + 1):
        rate = 1887.0 if k <= 0 else 0.0 if k <= 3 else 2833.0
        emitted, offered = emitted + rate, offered + 3200.0
        samples += [sample(at + k, "s", emitted, offered), sample(at + k, "z", emitted)]
    return samples


def test_rate_timeline_tells_the_sources_offered_rate_beside_what_they_emit() -> None:
    series = rate_timeline(congested_scale_out(0), ["s"], ["z"], at=1000.0, bucket_s=1.0, offered=True)
    assert {rate for _, rate in series["offered"]} == {3200.0}
    assert {rate for _, rate in series["input"]} == {rate for _, rate in series["output"]} == {1887.0}
    assert [t for t, _ in series["offered"]] == [t for t, _ in series["output"]]
    assert "offered" not in rate_timeline(congested_scale_out(0), ["s"], ["z"], at=1000.0, bucket_s=1.0)


def test_the_follow_up_writes_which_reference_it_measured_against() -> None:
    clock = SimpleNamespace(t=1006.0)
    topology = SimpleNamespace(sources=["s"], sinks=["z"])
    follow = CatchUpFollowUp(ListFeed(congested_scale_out(6)), topology, now=lambda: clock.t)  # type: ignore[arg-type]
    done: list[dict] = []
    status: dict = {}
    follow.follow(status, 1000.0, done.append, resumed_at=1003.0)
    follow.tick()
    assert status["catchUp"] == "measuring" and not done  # three points after the pause: no level yet
    follow.feed = ListFeed(congested_scale_out(15))
    clock.t = 1015.0
    follow.tick()
    assert done and status["catchUp"] == "measured", status
    assert status["catchUpReference"] == "newLevel"
    assert status["outputBefore"] == pytest.approx(1887.0) and status["outputAfter"] == pytest.approx(2833.0)
    assert status["catchUpMs"] == pytest.approx(4000.0) and status["stabilizationMs"] == pytest.approx(4000.0)


def test_the_record_carries_the_reference_into_last_scaling() -> None:
    record = ScalingRecord(Direction.OUT, 4, 5, "stela", "ccr", 3000.0, 1887.0, 1000.0)
    assert record.to_status()["catchUpReference"] is None  # not measured yet
    record.report.update(catchUpReference="newLevel", outputBefore=1887.0, outputAfter=2833.0)
    status = record.to_status()
    assert (status["catchUpReference"], status["outputBefore"], status["outputAfter"]) == ("newLevel", 1887.0, 2833.0)


def test_the_controller_says_what_catch_up_was_measured_against() -> None:
    *_, events, status, _, controller = setup()
    controller.start()
    record = controller.scale_to(3)
    assert record.outcome == "succeeded" and status.fields["lastScaling"][-1]["catchUp"] == "measuring"
    controller.feed = controller.follow_up.feed = ListFeed(congested_scale_out(15, at=record.started_at))
    controller.follow_up.tick()
    reason, message, _ = events.events[-1]
    assert reason == "CatchUpMeasured"
    assert message.endswith("measured against the new level 2,833/s (the scale raised the output from 1,887/s)")
    published = status.fields["lastScaling"][-1]
    assert published["catchUp"] == "measured" and published["catchUpReference"] == "newLevel"
    assert controller.last_scaling is not None
    kept = controller.last_scaling.to_status()  # what a later publication of the record says
    assert kept["catchUpReference"] == "newLevel" and kept["outputAfter"] == pytest.approx(2833.0)
