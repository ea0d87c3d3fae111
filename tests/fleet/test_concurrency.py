"""Enrollment and reports under concurrency, on PostgreSQL with real row locks.

Threads are released together by a barrier so the checks in the services race.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.audit.models import AuditEvent
from apps.core.errors import ApplicationError
from apps.fleet import enrollment
from apps.fleet.models import Agent, Deployment, EnrollmentToken
from apps.releases import services as releases
from tests.factories import enrolled_agent, enrollment_token, publish

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 6  # with the test's own connection, under the default pool size (10)
TIMEOUT_S = 60


def _race(calls) -> list:
    """Run every call in its own thread at the same moment; each returns its result
    or the ApplicationError (or other exception) it raised."""
    barrier = threading.Barrier(len(calls))

    def run(call):
        try:
            barrier.wait(timeout=TIMEOUT_S)
            return call()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls, timeout=TIMEOUT_S))


def test_concurrent_enrollments_never_exceed_max_uses(environment, superuser):
    _, secret = enrollment_token(environment, uses=3, actor=superuser)

    outcomes = _race([
        (lambda i=i: enrollment.agent_enroll(enrollment_token=secret, name=f"web-{i}",
                                           labels={}))
        for i in range(THREADS)
    ])

    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert all(isinstance(o, ApplicationError) and o.status == 401 for o in refused), refused
    assert len(refused) == THREADS - 3
    assert Agent.objects.count() == 3
    assert EnrollmentToken.objects.get().uses == 3


def test_concurrent_enrollments_of_one_name_with_different_tokens_are_409_not_500(
    environment, superuser
):
    secrets = [enrollment_token(environment, actor=superuser)[1] for _ in range(THREADS)]

    outcomes = _race([
        (lambda s=s: enrollment.agent_enroll(enrollment_token=s, name="web-1", labels={}))
        for s in secrets
    ])

    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refused) == THREADS - 1
    assert all(isinstance(o, ApplicationError) and o.status == 409 for o in refused), refused
    assert Agent.objects.filter(name="web-1").count() == 1


def test_concurrent_identical_pull_reports_record_one_deployment(environment, superuser):
    snapshot = publish(environment, superuser)
    agent = enrolled_agent(environment, "web-1", actor=superuser).agent

    outcomes = _race([
        (lambda: releases.report_intake(agent=agent, deployment_id=None,
                                        number=snapshot.number, checksum=snapshot.checksum,
                                        status="succeeded", message="ok"))
        for _ in range(THREADS)
    ])

    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    assert sorted(created for _, created in outcomes) == [False] * (THREADS - 1) + [True]
    assert Deployment.objects.filter(agent=agent).count() == 1


def test_concurrent_decommissions_at_one_generation_audit_one(environment, superuser):
    agent = enrolled_agent(environment, "web-1", actor=superuser).agent

    outcomes = _race([
        (lambda: releases.agent_decommission(agent=agent, expected_generation=1,
                                             actor=superuser))
        for _ in range(THREADS)
    ])

    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refused) == THREADS - 1
    assert all(isinstance(o, ApplicationError) and o.code == "decommissioned"
               for o in refused), refused
    assert Agent.objects.get(pk=agent.pk).generation == 2
    assert AuditEvent.objects.filter(action="agent.decommission").count() == 1


def test_enrollments_racing_for_a_freed_name_leave_one_agent_in_service(environment,
                                                                         superuser):
    old = enrolled_agent(environment, "web-1", actor=superuser).agent
    releases.agent_decommission(agent=old, expected_generation=1, actor=superuser)
    secrets = [enrollment_token(environment, actor=superuser)[1] for _ in range(THREADS)]

    outcomes = _race([
        (lambda s=s: enrollment.agent_enroll(enrollment_token=s, name="web-1", labels={}))
        for s in secrets
    ])

    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refused) == THREADS - 1
    assert all(isinstance(o, ApplicationError) and o.code == "name_taken"
               for o in refused), refused
    assert Agent.objects.in_service().filter(name="web-1").count() == 1
    assert Agent.objects.filter(name="web-1").count() == 2
