"""GET /api/v1/agent/snapshots/<n>/bundle: a snapshot's stored bytes, ETag = checksum."""

import gzip
import json

import pytest
from rest_framework.test import APIClient

from apps.environments.services import environment_file_put
from apps.releases.publishing import publication_abandon
from apps.releases.services import environment_update, snapshot_publish
from apps.snapshots.models import Snapshot
from configlang.rendering import content_checksum
from tests.api_helpers import assert_error
from tests.factories import publish, publish_variant
from tests.fleet.support import bundle_url


@pytest.fixture
def with_fallback(environment, superuser):
    environment_file_put(environment=environment, kind="fallback", path="www/index.html",
                         text="<p>maintenance</p>\n", actor=superuser)
    return publish(environment, superuser)


def test_bundle_is_the_stored_json_with_the_checksum_as_etag(enroll, with_fallback):
    snapshot = with_fallback

    response = enroll().client.get(bundle_url(1))

    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert response["ETag"] == f'"{snapshot.checksum}"'
    assert response.content == bytes(snapshot.bundle)
    body = json.loads(response.content)
    assert set(body) == {"number", "label", "checksum", "files", "fallback_files", "secrets"}
    assert body["secrets"] == []  # no template places a secret
    assert (body["number"], body["label"], body["checksum"]) == (
        1, snapshot.label, snapshot.checksum)
    assert [f["path"] for f in body["files"]] == ["nginx/shop.conf", "shop/app.json"]
    assert body["fallback_files"] == [{"path": "www/index.html",
                                       "content": "<p>maintenance</p>\n"}]


def test_bundle_checksum_is_the_content_checksum_of_its_files(enroll, with_fallback):
    body = enroll().client.get(bundle_url(1)).json()

    assert body["checksum"] == content_checksum(body["files"])
    assert body["files"] == Snapshot.objects.get(number=1).files


@pytest.mark.parametrize("header", ["exact", "weak", "list", "star"])
def test_bundle_with_matching_if_none_match_is_304(header, enroll, first):
    etag = f'"{first.checksum}"'
    value = {"exact": etag, "weak": f"W/{etag}", "list": f'"x", {etag}', "star": "*"}[header]

    response = enroll().client.get(bundle_url(1), HTTP_IF_NONE_MATCH=value)

    assert response.status_code == 304
    assert response.content == b""


def test_bundle_304_repeats_the_etag(enroll, first):
    etag = f'"{first.checksum}"'

    response = enroll().client.get(bundle_url(1), HTTP_IF_NONE_MATCH=etag)

    assert response.status_code == 304
    assert response.get("ETag") == etag


def test_bundle_with_an_old_etag_is_200(enroll, first, environment, superuser):
    publish_variant(environment, superuser, workers=8)

    response = enroll().client.get(bundle_url(2), HTTP_IF_NONE_MATCH=f'"{first.checksum}"')

    assert response.status_code == 200
    assert response.json()["number"] == 2


def test_older_snapshots_stay_downloadable(enroll, first, environment, superuser):
    publish_variant(environment, superuser, workers=8)

    response = enroll().client.get(bundle_url(1))

    assert response.status_code == 200
    assert response.json()["checksum"] == first.checksum


def _publish_blog_variant(blog, superuser) -> Snapshot:
    environment_update(environment=blog, config="a: 2\n", actor=superuser)
    snapshot = publish(blog, superuser)
    assert snapshot.number == 2
    return snapshot


def test_another_environments_snapshot_is_404(enroll, first, blog, superuser):
    environment_file_put(environment=blog, kind="template", path="blog.conf",
                         text="a = {{ a }}\n", actor=superuser)
    publish(blog, superuser)
    blog_second = _publish_blog_variant(blog, superuser)
    agent = enroll()

    foreign = agent.client.get(bundle_url(blog_second.number))
    own = agent.client.get(bundle_url(1))

    assert_error(foreign, 404, "not_found")
    assert own.json()["checksum"] == first.checksum != blog_second.checksum


def test_invalid_snapshot_is_404(enroll, first, environment, superuser):
    publication = snapshot_publish(environment=environment, actor=superuser)
    invalid = publication_abandon(publication_id=str(publication.pk), reason="test").snapshot
    assert (invalid.number, invalid.state) == (2, "invalid")

    response = enroll().client.get(bundle_url(2))

    assert_error(response, 404, "not_found")


def test_unknown_snapshot_number_is_404(enroll, first):
    assert_error(enroll().client.get(bundle_url(99)), 404, "not_found")


def test_bundle_needs_an_agent_token(first, api_client, superuser):
    anonymous = APIClient().get(bundle_url(1))
    user = api_client(superuser).get(bundle_url(1))

    assert_error(anonymous, 401)
    assert_error(user, 401)


# --- gzip, stored once ---------------------------------------------------------------


@pytest.mark.parametrize("accept", ["gzip", "gzip, deflate, br", "x-gzip", "*",
                                    "br;q=1.0, gzip;q=0.5", "GZIP"])
def test_a_client_accepting_gzip_gets_the_stored_compressed_bytes(enroll, first, accept):
    response = enroll().client.get(bundle_url(1), HTTP_ACCEPT_ENCODING=accept)

    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in response["Vary"]
    assert response["ETag"] == f'"{first.checksum}+gzip"'
    assert response.content == bytes(Snapshot.objects.get(pk=first.pk).bundle_gzip)
    assert gzip.decompress(response.content) == bytes(first.bundle)


@pytest.mark.parametrize("accept", [None, "", "identity", "br", "gzip;q=0", "*;q=0",
                                    "*, gzip;q=0", "gzip;q=abc"])
def test_a_client_not_accepting_gzip_gets_the_identity_bytes(enroll, first, accept):
    headers = {} if accept is None else {"HTTP_ACCEPT_ENCODING": accept}

    response = enroll().client.get(bundle_url(1), **headers)

    assert response.status_code == 200
    assert not response.has_header("Content-Encoding")
    assert response["ETag"] == f'"{first.checksum}"'
    assert response.content == bytes(first.bundle)


def test_the_gzip_representation_has_its_own_conditional_answer(enroll, first):
    agent = enroll()
    gzip_etag = f'"{first.checksum}+gzip"'

    same = agent.client.get(bundle_url(1), HTTP_ACCEPT_ENCODING="gzip",
                            HTTP_IF_NONE_MATCH=gzip_etag)
    other = agent.client.get(bundle_url(1), HTTP_IF_NONE_MATCH=gzip_etag)

    assert (same.status_code, same["ETag"]) == (304, gzip_etag)
    assert other.status_code == 200  # the identity representation is another one


def test_the_compressed_bundle_is_made_once_and_deterministically(first):
    stored = bytes(Snapshot.objects.get(pk=first.pk).bundle_gzip)

    assert stored == gzip.compress(bytes(first.bundle), compresslevel=6, mtime=0)
    assert len(stored) < len(bytes(first.bundle))


def test_the_bundle_answer_reads_one_stored_form(enroll, first, django_assert_num_queries):
    agent = enroll()

    with django_assert_num_queries(2) as captured:  # the agent's token, the snapshot
        agent.client.get(bundle_url(1), HTTP_ACCEPT_ENCODING="gzip")

    [query] = [q["sql"] for q in captured.captured_queries
               if q["sql"].startswith('SELECT "snapshots_snapshot"')]
    assert '"bundle_gzip"' in query
    assert '"bundle",' not in query and '"bundle" FROM' not in query
