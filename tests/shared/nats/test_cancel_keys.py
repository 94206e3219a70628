from embedfleet.shared.nats.cancel_keys import CancelKeys
from embedfleet.shared.protocol import Cancel, Held, encode

KEY, OTHER = b"k" * 16, b"o" * 16


def test_a_key_is_held_until_its_deadline():
    keys = CancelKeys()
    keys.add(KEY, deadline=110.0, now=100.0)
    assert keys.holds(KEY, 105.0) and keys.holds(KEY, 110.0)
    assert not keys.holds(KEY, 110.5)
    assert not keys.holds(OTHER, 105.0)
    assert not keys.holds(None, 105.0)


def test_a_far_deadline_is_held_at_most_longest():
    keys = CancelKeys(longest=60.0)
    keys.add(KEY, deadline=1e12, now=100.0)
    assert keys.holds(KEY, 160.0) and not keys.holds(KEY, 161.0)


def test_passed_keys_are_swept_and_the_oldest_go_past_capacity():
    keys = CancelKeys(capacity=3)
    for i in range(3):
        keys.add(bytes([i]) * 16, deadline=1000.0, now=100.0)
    keys.add(KEY, deadline=1000.0, now=100.0)
    assert len(keys) == 3
    assert not keys.holds(bytes([0]) * 16, 100.0) and keys.holds(KEY, 100.0)
    keys.add(OTHER, deadline=200.0, now=1500.0)  # every other key's deadline has passed
    assert len(keys) == 1 and keys.holds(OTHER, 150.0)


def test_a_cancel_message_adds_its_key_and_a_malformed_one_nothing():
    keys = CancelKeys()
    cancel = Cancel("r", KEY, 110.0)
    assert keys.take(encode(cancel), 100.0) == cancel
    assert keys.holds(KEY, 105.0)
    assert keys.take(encode(Held("r", 0, 1, "w")), 100.0) is None
    assert keys.take(b"\x81\xa1v\x02", 100.0) is None
    assert len(keys) == 1
