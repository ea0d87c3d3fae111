"""Signing out ends the live updates of that session at once."""

from apps.core.events import emit_session_end


def end_live_session(sender, request, user, **kwargs) -> None:
    if user is not None:
        emit_session_end(user_id=user.pk, session_key=request.session.session_key)
