"""`up`'s lock on its data folder: the file is its owner's alone and holds no secret (a pid and a start
time), a second holder is refused naming the first with its command line's secrets hidden, and the
file goes when the lock is let go."""

from __future__ import annotations

import os
import re

import pytest

from embedfleet.services.up.lock import LOCK_FILE, hide_secrets, hold_data_dir
from embedfleet.shared.config.option import ConfigError


def test_the_lock_file_is_the_owners_alone_and_names_only_a_pid_and_a_time(tmp_path):
    lock = hold_data_dir(tmp_path / "data")
    try:
        path = tmp_path / "data" / LOCK_FILE
        assert path.stat().st_mode & 0o777 == 0o600
        assert re.fullmatch(rf"pid {os.getpid()} started \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ\n", path.read_text())
    finally:
        lock.close()
    assert not path.exists()
    lock.close()  # twice: nothing more


def test_a_lock_file_an_older_up_left_readable_by_all_is_made_the_owners_alone(tmp_path):
    (tmp_path / LOCK_FILE).write_text("pid 1 (embedfleet up --api-keys k1)\n")
    (tmp_path / LOCK_FILE).chmod(0o644)
    lock = hold_data_dir(tmp_path)
    try:
        assert (tmp_path / LOCK_FILE).stat().st_mode & 0o777 == 0o600
        assert "k1" not in (tmp_path / LOCK_FILE).read_text()
    finally:
        lock.close()


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    lock = hold_data_dir(tmp_path)
    try:
        with pytest.raises(ConfigError) as caught:
            hold_data_dir(tmp_path)  # another open file: flock refuses it, in this process too
        message = str(caught.value)
        assert message.startswith(f"the data folder {tmp_path} is in use by pid {os.getpid()} (")
        assert " started 20" in message and f"(lock {tmp_path / LOCK_FILE})" in message
    finally:
        lock.close()
    hold_data_dir(tmp_path).close()  # let go: the next one takes it


def test_secret_options_values_are_hidden_in_a_command_line_shown():
    args = ["embedfleet", "up", "--api-keys", "k1,k2", "--operator-keys=op", "--port", "8080"]
    args += ["--nats", "nats://u:p@h:4222", "--model", "m", "--api-keys-file", "/keys"]
    assert hide_secrets(args) == [
        "embedfleet",
        "up",
        "--api-keys",
        "***",
        "--operator-keys=***",
        "--port",
        "8080",
        "--nats",
        "***",
        "--model",
        "m",
        "--api-keys-file",
        "/keys",
    ]
    assert hide_secrets(["--api-keys", "--api-keys"]) == ["--api-keys", "***"]  # a value that looks like a flag
