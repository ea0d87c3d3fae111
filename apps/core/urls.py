"""URL prefixes every app's API routes share (under /api/v1/)."""

ENV = "environments/<slug:application>/<slug:environment>"
SNAP = f"{ENV}/snapshots/<int:number>"
