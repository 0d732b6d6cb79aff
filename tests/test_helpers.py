"""The test suite's own plumbing: which servers a run uses."""

from __future__ import annotations

from tests.helpers import use_containers


def test_a_redis_url_of_ones_own_is_honoured_alone_even_with_docker() -> None:
    assert use_containers("redis://127.0.0.1:6379/0", None, docker=True) is False
    assert use_containers(None, "postgresql://u@h/db", docker=True) is False


def test_containers_only_when_docker_answers_and_no_server_was_given() -> None:
    assert use_containers(None, None, docker=True) is True
    assert use_containers(None, None, docker=False) is False
