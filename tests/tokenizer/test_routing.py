from embedfleet.services.tokenizer.routing import Router
from embedfleet.shared.protocol import LoadReport, decode, encode


def _report(wid: str, queued: int, leaving: bool = False, interval: float = 0.1) -> LoadReport:
    return LoadReport(
        id=wid, model="m", subject=f"direct.{wid}", queued_tokens=queued, interval=interval, leaving=leaving
    )


def test_load_report_round_trip():
    r = _report("a", 12, leaving=True)
    assert decode(encode(r)) == r


def test_picks_the_least_loaded_live_worker():
    router = Router()
    assert router.pick(100, now=0.0) is None  # nothing known: the caller uses the queue group
    router.update(_report("a", 5000), now=0.0)
    router.update(_report("b", 200), now=0.0)
    assert router.pick(100, now=0.05) == "direct.b"
    assert router.live(0.05) == ["a", "b"]


def test_tokens_sent_since_the_report_count_as_load():
    router = Router()
    router.update(_report("a", 0), now=0.0)
    router.update(_report("b", 0), now=0.0)
    picks = [router.pick(256, now=0.01) for _ in range(6)]
    assert picks.count("direct.a") == 3 and picks.count("direct.b") == 3  # a burst spreads out
    router.update(_report("a", 0), now=0.02)  # a fresh report resets what was charged to a
    assert router.pick(256, now=0.03) == "direct.a"


def test_silent_and_leaving_workers_are_dropped():
    router = Router()
    router.update(_report("a", 0), now=0.0)
    router.update(_report("b", 10_000), now=0.0)
    router.update(_report("b", 10_000), now=0.5)
    assert router.pick(1, now=0.5) == "direct.b"  # a has been silent for 5 intervals
    assert router.live(0.5) == ["b"]
    router.update(_report("b", 0, leaving=True), now=0.5)
    assert router.pick(1, now=0.5) is None


def test_a_worker_whose_batches_reached_nobody_is_forgotten_at_once():
    router = Router()
    router.update(_report("a", 0), now=0.0)
    router.update(_report("b", 10_000), now=0.0)
    assert router.pick(1, now=0.01) == "direct.a"
    router.forget("direct.a")  # its reports are fresh, but its process is gone
    assert router.live(0.01) == ["b"] and router.pick(1, now=0.01) == "direct.b"
    router.forget("direct.b")
    assert router.pick(1, now=0.01) is None


def test_a_faster_worker_takes_work_until_its_queue_outweighs_the_difference():
    router = Router()
    fast = LoadReport(id="fast", model="m", subject="direct.fast", queued_tokens=0, interval=0.1, rate=4000.0)
    slow = LoadReport(id="slow", model="m", subject="direct.slow", queued_tokens=0, interval=0.1, rate=1000.0)
    router.update(fast, now=0.0)
    router.update(slow, now=0.0)
    picks = [router.pick(100, now=0.01) for _ in range(10)]
    # fast finishes k batches in k*100/4000 s; slow one in 100/1000 s: fast takes the first three
    assert picks[:3] == ["direct.fast"] * 3
    assert picks.count("direct.fast") == 8 and picks.count("direct.slow") == 2


def test_workers_a_request_names_to_pass_over_get_none_of_its_batches_while_another_is_known():
    """A worker its requester took for stopped (silent, its idle report not stale here for seconds) looks the
    least loaded: the request's batches go to the others, and to the queue group when it is the only one."""
    router = Router()
    router.update(_report("a", 0, interval=2.0), now=0.0)  # idle when it stopped: live here for 6 s
    router.update(_report("b", 5000), now=0.0)
    assert router.pick(100, now=0.01) == "direct.a"
    assert [router.pick(100, now=0.02, avoid=("a",)) for _ in range(3)] == ["direct.b"] * 3
    assert router.pick(100, now=0.03, avoid=("x", "y")) == "direct.a"  # names it does not know change nothing
    router.update(_report("b", 0, leaving=True), now=0.04)
    assert router.pick(100, now=0.05, avoid=("a",)) is None  # only a known: the queue group
    assert router.live(0.05) == ["a"]  # passed over for that request, not forgotten
