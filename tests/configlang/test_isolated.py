"""The backstop: a render in a child process limited in memory and time."""

import multiprocessing
import os
import select
import threading
import time
from unittest import mock

import pytest

from configlang import isolated, rendering
from configlang.isolated import render_isolated
from tests.configlang.test_render_budget import PRODUCTION
from tests.configlang.test_rendering import make_source
from tests.render_children import hang, hog, nothing

pytestmark = [pytest.mark.processes, pytest.mark.serial]


@pytest.fixture(autouse=True)
def no_spare():
    """Each test starts its children the way it sets up (some change how)."""
    isolated.discard_spare()
    yield
    isolated.discard_spare()


def _source(template: str):
    return make_source(config="name: shop\n", templates={"a.conf": template}, **PRODUCTION)


def test_an_isolated_render_answers_what_an_inline_one_does():
    source = _source("{{ name }} {% for i in range(3) %}{{ i }}{% endfor %}")
    rendered = render_isolated(source, seconds=5, memory_bytes=256 << 20)
    assert rendered.files == rendering.render_source(source).files
    assert rendered.problems == []


def test_the_budget_still_names_template_and_line_in_the_child():
    rendered = render_isolated(_source("x\n{{ 'x'|center(2**40) }}"), seconds=5,
                               memory_bytes=256 << 20)
    [problem] = rendered.problems
    assert (problem.code, problem.file, problem.line) == ("render_limit", "a.conf", 2)


def test_a_child_over_its_memory_limit_is_a_render_limit_not_a_dead_parent():
    rendered = render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20, render=hog)
    [problem] = rendered.problems
    assert problem.code == "render_limit"
    assert "memory" in problem.message


def test_a_child_that_never_answers_is_stopped():
    started = time.monotonic()
    rendered = render_isolated(_source("x"), seconds=1, memory_bytes=128 << 20, grace=1,
                               render=hang)
    assert time.monotonic() - started < 5
    [problem] = rendered.problems
    assert problem.code == "render_limit"


def test_where_no_child_can_be_started_the_render_runs_here():
    with mock.patch.object(isolated.subprocess, "Popen", side_effect=OSError("no")):
        rendered = render_isolated(_source("{{ name }}"), seconds=5, memory_bytes=128 << 20)
    assert rendered.files == [{"path": "a.conf", "content": "shop"}]


def test_a_child_answering_something_else_than_a_render_is_a_failed_render():
    rendered = render_isolated(make_source(), seconds=2, memory_bytes=256 << 20,
                               render=nothing)
    assert [p.code for p in rendered.problems] == ["render_failed"]


class _BlocksWhenFinalized:
    """What an SQLite connection does when finalized while another thread holds
    SQLite's mutex: blocks for ever."""

    def __init__(self, lock):
        self.lock = lock

    def __del__(self):
        self.lock.acquire()


def test_nothing_another_server_thread_holds_can_block_the_child():
    """A child forked from this multi-threaded process would finalize the other
    thread's thread-local object and block; a fresh interpreter never has it."""
    held, local = threading.Lock(), threading.local()
    ready, done = threading.Event(), threading.Event()

    def server_thread():
        local.connection = _BlocksWhenFinalized(held)
        ready.set()
        done.wait(30)

    held.acquire()
    thread = threading.Thread(target=server_thread)
    thread.start()
    ready.wait()
    try:
        started = time.monotonic()
        rendered = render_isolated(_source("{{ name }}"), seconds=2, memory_bytes=128 << 20,
                                   grace=1)
        assert time.monotonic() - started < 2.5
        assert rendered.files == [{"path": "a.conf", "content": "shop"}]
    finally:
        held.release()
        done.set()
        thread.join()


def test_renders_from_many_threads_at_once_all_answer():
    source = _source("{% for i in range(2000) %}{{ i }}{% endfor %}")
    answers, errors = [], []

    def renders():
        try:
            for _ in range(8):
                rendered = render_isolated(source, seconds=2, memory_bytes=256 << 20, grace=1)
                answers.append(rendered.problems)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=renders) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # None was stopped by its 2 s budget (that would be a problem of its own).
    assert answers == [[]] * 32


def _render_from_a_daemonic_process(queue):
    result = render_isolated(make_source(), seconds=5, memory_bytes=256 * 1024 * 1024)
    queue.put((result.is_valid, [p.code for p in result.problems]))


def test_a_daemonic_process_renders_isolated_too():
    # What a Celery prefork pool process is: multiprocessing refuses it children.
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_render_from_a_daemonic_process, args=(queue,),
                              daemon=True)
    process.start()
    try:
        assert queue.get(timeout=30) == (True, [])
    finally:
        process.join(10)


def test_the_childs_start_is_not_charged_to_the_render(monkeypatch):
    """A busy machine starts the child slowly: its wall time counts once it is ready."""
    real = isolated.subprocess.Popen

    def slow_start(args, **kwargs):
        args = [args[0], "-c", "import time; time.sleep(1.5); import runpy; "
                "runpy.run_module('configlang.isolated', run_name='__main__')"]
        return real(args, **kwargs)

    monkeypatch.setattr(isolated.subprocess, "Popen", slow_start)
    rendered = render_isolated(_source("{{ name }}"), seconds=0.5, memory_bytes=256 << 20,
                               grace=0.5)
    assert rendered.problems == []
    assert rendered.files == [{"path": "a.conf", "content": "shop"}]


def test_a_child_that_does_not_start_in_its_allowance_is_a_timed_out_stop(monkeypatch):
    real = isolated.subprocess.Popen
    monkeypatch.setattr(isolated.subprocess, "Popen", lambda args, **kw: real(
        [args[0], "-c", "import time; time.sleep(30)"], **kw))
    started = time.monotonic()
    rendered = render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20, startup=0.5)
    assert time.monotonic() - started < 3
    [problem] = rendered.problems
    assert problem.code == "render_limit" and "could not start" in problem.message
    assert rendered.timed_out and rendered.load_dependent


def test_a_wall_time_stop_is_timed_out_and_a_memory_stop_is_not():
    hung = render_isolated(_source("x"), seconds=1, memory_bytes=128 << 20, grace=0.5,
                           render=hang)
    hogged = render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20, render=hog)
    assert hung.timed_out and not hogged.timed_out
    assert [p.code for p in hogged.problems] == ["render_limit"]


def test_a_render_takes_the_spare_child_and_leaves_a_new_one_started():
    render_isolated(_source("{{ name }}"), seconds=5, memory_bytes=128 << 20)
    spare = isolated._spare
    assert spare is not None and spare.poll() is None
    assert select.select([spare.stdout], [], [], 30)[0]  # READY: started ahead of the render
    rendered = render_isolated(_source("{{ name }}"), seconds=5, memory_bytes=128 << 20)
    assert rendered.files == [{"path": "a.conf", "content": "shop"}]
    assert spare.returncode == 0 and spare.stdout.closed  # it did this render
    assert isolated._spare is not None and isolated._spare is not spare


def test_a_spare_that_died_is_replaced_not_used():
    render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20)
    dead = isolated._spare
    dead.kill()
    dead.wait()
    rendered = render_isolated(_source("{{ name }}"), seconds=5, memory_bytes=128 << 20)
    assert rendered.problems == []
    assert rendered.files == [{"path": "a.conf", "content": "shop"}]


def test_a_spare_still_holds_the_limits_of_the_render_it_is_given():
    render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20)  # leaves a spare
    assert isolated._spare is not None
    rendered = render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20, render=hog)
    assert [p.code for p in rendered.problems] == ["render_limit"]
    assert "memory" in rendered.problems[0].message


def _spare_seen_after_fork(queue):
    queue.put(isolated._spare is None)


def test_a_forked_process_forgets_its_parents_spare_and_the_parent_keeps_it():
    render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20)
    spare = isolated._spare
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_spare_seen_after_fork, args=(queue,))
    process.start()
    try:
        assert queue.get(timeout=30) is True
    finally:
        process.join(10)
    assert isolated._spare is spare and spare.poll() is None
    assert os.getpid() != process.pid
