"""A job's first joins are staggered as torch does; a re-rendezvous is not, even from round 0
(ddpjob_trainer.rendezvous.stagger)."""
from ddpjob_trainer.rendezvous import stagger
from tests.rendezvous.test_liveness import handlers, rendezvous_together


def test_the_survivors_re_rendezvous_from_round_0_is_not_staggered(monkeypatch):
    delays = []
    monkeypatch.setattr(stagger, "_torch_delay", delays.append)
    survivor, dead = handlers(2, min_nodes=1)
    rendezvous_together([survivor, dead])
    assert delays.count((0, 0.3)) == 2, f"each node's first join is staggered: {delays}"
    assert survivor._state_holder.state.round == 0, "what made torch take the restart for a first run"

    delays.clear()
    dead._stop_heartbeats()
    dead.liveness.stop()
    assert survivor.next_rendezvous().world_size == 1
    assert (0, 0.3) not in delays, delays
    survivor.shutdown()


def test_only_the_stagger_is_skipped_and_only_in_the_thread_that_asked(monkeypatch):
    delays = []
    monkeypatch.setattr(stagger, "_torch_delay", delays.append)
    with stagger.without_first_run_stagger():
        stagger._delay((0, 0.3))
        stagger._delay(1)  # the executor's wait on SYNC
    stagger._delay((0, 0.3))
    with stagger.without_first_run_stagger(False):
        stagger._delay((0, 0.3))
    assert delays == [1, (0, 0.3), (0, 0.3)]
