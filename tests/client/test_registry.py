"""@weft.workflow / @weft.activity definitions: names, versions, double import, clear errors."""

from __future__ import annotations

import importlib
import sys
import textwrap
from datetime import timedelta

import pytest

import weft_django as weft
from weft_django.registry import ActivityDefinition, registry, resolve_activity, resolve_workflow


def test_default_names_and_versions():
    @weft.workflow
    def plain(ctx):
        yield ctx.sleep(1)

    definition = resolve_workflow(plain)
    assert definition.name == f"{__name__}.test_default_names_and_versions.<locals>.plain"
    assert definition.version == "1"
    assert resolve_workflow(definition.name) is definition


def test_latest_registered_version_wins_for_new_starts():
    @weft.workflow(name="registry.versions", version="1")
    def v1(ctx):
        yield ctx.sleep(1)

    @weft.workflow(name="registry.versions", version="2")
    def v2(ctx):
        yield ctx.sleep(2)

    assert registry.workflow("registry.versions").version == "2"
    assert registry.workflow("registry.versions", "1").fn is v1


def test_a_different_function_under_a_taken_name_raises():
    @weft.workflow(name="registry.taken")
    def first(ctx):
        yield ctx.sleep(1)

    with pytest.raises(weft.WorkflowDefinitionError, match='"registry.taken" version "1" is already registered'):

        @weft.workflow(name="registry.taken")
        def second(ctx):
            yield ctx.sleep(1)


def test_importing_the_same_module_twice_is_a_no_op(tmp_path, monkeypatch):
    (tmp_path / "double_import_mod.py").write_text(
        textwrap.dedent(
            """
            import weft_django as weft

            @weft.activity(name="registry.double.act")
            def act():
                return 1

            @weft.workflow(name="registry.double.wf")
            def wf(ctx):
                yield ctx.run(act)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    first = importlib.import_module("double_import_mod")
    del sys.modules["double_import_mod"]
    second = importlib.import_module("double_import_mod")  # a second module object, same source
    assert resolve_workflow(second.wf) is resolve_workflow(first.wf)
    assert registry.activity("registry.double.act") is first.act


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: weft.workflow(lambda ctx: None), "needs a generator function"),
        (lambda: weft.workflow(name="")(_gen), "non-empty string"),
        (lambda: weft.workflow(name="x" * 256)(_gen), "at most 255"),
        (lambda: weft.workflow(version="")(_gen), "version must be a non-empty string"),
        (lambda: weft.activity(_gen), "needs a plain function"),
        (lambda: weft.activity(timeout="soon")(_plain), "must be a duration"),
        (lambda: weft.activity(timeout=0)(_plain), "greater than zero"),
        (lambda: weft.activity(retry="3 times")(_plain), "must be a weft.RetryPolicy"),
        (lambda: weft.activity(executor="processes")(_plain), 'executor must be "threads" or "celery"'),
        # a Celery queue is stored with each attempt sent: one too long blocked every send (session 19)
        (lambda: weft.activity(executor="celery", queue="q" * 256)(_plain), "Celery queue name must be .* at most 255"),
        (lambda: weft.activity(executor="celery", queue="")(_plain), "Celery queue name must be a non-empty"),
        (lambda: weft.activity(name="registry.q")(_plain).options(queue="a\x00b"), "without NUL"),
        (lambda: weft.workflow(name="nul\x00name")(_gen), "without NUL"),
        (lambda: weft.RetryPolicy(max_attempts=0), "max_attempts must be a whole number >= 1"),
        (lambda: weft.RetryPolicy(backoff_multiplier=0.5), "backoff_multiplier must be a number >= 1"),
        (lambda: weft.RetryPolicy(initial_backoff="-1s"), "must be a duration"),
        (lambda: weft.RetryPolicy(non_retryable="ValueError"), "list of exception names"),
    ],
)
def test_bad_definitions_raise_typed_errors(make, message):
    with pytest.raises(weft.WorkflowDefinitionError, match=message):
        make()


def _gen(ctx):
    yield ctx.sleep(1)


def _plain():
    return 1


def test_unknown_names_say_what_to_do():
    with pytest.raises(weft.WorkflowNotRegisteredError, match="Define it with @weft.workflow"):
        resolve_workflow("registry.nope")
    with pytest.raises(weft.WorkflowNotRegisteredError, match="decorate it with @weft.workflow"):
        resolve_workflow(_plain)
    with pytest.raises(weft.WorkflowNotRegisteredError, match="@weft.activity"):
        resolve_activity("registry.nope")


def test_retry_policy_defaults_backoff_and_matching():
    policy = weft.RetryPolicy()
    assert policy.attempts == 3
    assert [policy.backoff(k) for k in (1, 2, 3, 10)] == [
        timedelta(seconds=1),
        timedelta(seconds=2),
        timedelta(seconds=4),
        timedelta(seconds=30),
    ]
    custom = weft.RetryPolicy(
        initial_backoff="500ms",
        backoff_multiplier=3,
        max_backoff="2s",
        non_retryable=["KeyError", "builtins.ZeroDivisionError"],
    )
    assert [custom.backoff(k) for k in (1, 2, 3)] == [
        timedelta(milliseconds=500),
        timedelta(seconds=1.5),
        timedelta(seconds=2),
    ]
    assert not custom.is_retryable(KeyError("x"))
    assert not custom.is_retryable(ZeroDivisionError())

    class Subclass(KeyError):
        pass

    assert not custom.is_retryable(Subclass())  # anywhere in the MRO
    assert custom.is_retryable(ValueError())


def test_activities_run_directly_and_take_per_call_options():
    @weft.activity(name="registry.direct", timeout="5s")
    def direct(a, b=2):
        return a * b

    assert isinstance(direct, ActivityDefinition)
    assert direct(3) == 6
    faster = direct.options(timeout="1s", retry=weft.RetryPolicy(max_attempts=2))
    assert faster.timeout == timedelta(seconds=1) and faster.retry.attempts == 2
    assert direct.timeout == timedelta(seconds=5)  # the original is unchanged
    with pytest.raises(weft.WorkflowDefinitionError, match="Unknown activity option"):
        direct.options(atomic=True)


def test_importing_the_package_does_not_touch_the_app_registry():
    import subprocess

    code = (
        "import weft_django, sys\n"
        "assert 'weft_django.models' not in sys.modules, 'models imported'\n"
        "assert 'weft_django.client' not in sys.modules, 'client imported'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
