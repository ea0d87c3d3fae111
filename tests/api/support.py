"""URLs of the API tests, and the table of every API route."""

ENV = "/api/v1/environments/shop/prod"
OTHER_ENV = "/api/v1/environments/blog/prod"
MISSING_ENV = "/api/v1/environments/nosuch/prod"


# Every API route, as (method, path, role needed, body, status of a success). `{env}` is
# an environment's "<application>/<name>", `{publication}` the id of a publication of
# shop/prod.
ROUTES = [
    ("get", "/api/v1/environments", "viewer", None, 200),
    ("get", "/api/v1/environments/{env}", "viewer", None, 200),
    ("patch", "/api/v1/environments/{env}", "owner", {"poll_interval_s": 60}, 200),
    ("get", "/api/v1/environments/{env}/templates/nginx/shop.conf", "viewer", None, 200),
    ("put", "/api/v1/environments/{env}/templates/extra/new.conf", "owner", {"source": "x\n"},
     200),
    ("delete", "/api/v1/environments/{env}/templates/shop/app.json", "owner", None, 204),
    ("get", "/api/v1/environments/{env}/fallback-files/www/index.html", "viewer", None, 200),
    ("put", "/api/v1/environments/{env}/fallback-files/www/new.html", "owner",
     {"content": "<p>down</p>\n"}, 200),
    ("delete", "/api/v1/environments/{env}/fallback-files/www/index.html", "owner", None, 204),
    ("get", "/api/v1/environments/{env}/preview", "viewer", None, 200),
    ("post", "/api/v1/environments/{env}/publish", "deployer", None, 202),
    ("get", "/api/v1/environments/{env}/pending", "viewer", None, 200),
    ("get", "/api/v1/environments/{env}/audit", "viewer", None, 200),
    ("get", "/api/v1/environments/{env}/snapshots", "viewer", None, 200),
    ("get", "/api/v1/environments/{env}/snapshots/2", "viewer", None, 200),
    ("get", "/api/v1/environments/{env}/snapshots/2/diff", "viewer", None, 200),
    ("post", "/api/v1/environments/{env}/snapshots/1/rollback", "deployer", None, 202),
    ("get", "/api/v1/publications/{publication}", "viewer", None, 200),
    ("get", "/api/v1/environments/{env}/retention", "viewer", None, 200),
]

ENV_ROUTES = [route for route in ROUTES if "{env}" in route[1]]
