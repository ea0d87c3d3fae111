"""Agents authenticate with their own token: `Authorization: Bearer bwa_<key>.<secret>`.

Enrollment tokens (bwe_) and user tokens (bwu_) are refused here.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from apps.core import tokens
from apps.fleet.enrollment import AGENT_TOKEN_PREFIX, misplaced_token
from apps.fleet.models import Agent
from apps.fleet.selectors import agents_with_desired


class AgentPrincipal:
    """The request.user of an agent's request."""

    is_authenticated = True
    is_active = True
    is_anonymous = False
    is_superuser = False
    is_staff = False

    def __init__(self, agent: Agent):
        self.agent = agent
        self.pk = None

    def __str__(self) -> str:
        return f"agent {self.agent.name}"


def agent_token_in(authorization: str) -> tuple[str, str] | None:
    """(key, secret) of the agent token an `Authorization` header presents, or None:
    the one reading of it, for Django's views and agentapi alike."""
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return tokens.parse(presented.strip(), AGENT_TOKEN_PREFIX)


def presented_agent_token(request) -> tuple[str, str] | None:
    return agent_token_in(request.META.get("HTTP_AUTHORIZATION", ""))


class AgentTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        parsed = presented_agent_token(request)
        if parsed is None:
            scheme, _, presented = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
            misplaced = misplaced_token(presented, expected="agent") if (
                scheme.lower() == "bearer") else None
            raise exceptions.AuthenticationFailed(misplaced or "An agent token is required.")
        key, secret = parsed
        # The token key is unique: no ordering, and no snapshot content loaded.
        agent = next(iter(agents_with_desired(Agent.objects.filter(token_key=key))[:1]), None)
        if agent is None or not tokens.secret_matches(secret, agent.token_hash):
            raise exceptions.AuthenticationFailed("Unknown agent token.")
        if agent.decommissioned_at is not None:
            raise exceptions.AuthenticationFailed(
                "This agent was decommissioned; enroll a new agent (its name is free).")
        if agent.token_revoked_at is not None:
            raise exceptions.AuthenticationFailed("This agent token has been revoked.")
        return AgentPrincipal(agent), agent

    def authenticate_header(self, request):
        return "Bearer"


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = AgentTokenAuthentication
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "bwa_<key>.<secret>"}
