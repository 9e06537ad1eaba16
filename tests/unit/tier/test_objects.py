"""Object stores of the tier: a local directory and a real S3 service (SeaweedFS) behave alike:
whole writes, conditional creates that never overwrite, sorted listings, range reads, and
errors that say what to check."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from store.tier.objects import (LocalDirectory, ObjectNotFound, ObjectStoreError, S3Bucket, TierLocation,
                                load_location, save_location)
from tests.tier_support import S3Endpoint, SeaweedFS, free_port_pairs


@pytest.fixture(params=["local", "s3"])
def objects(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "local":
        return LocalDirectory(str(tmp_path / "tier"))
    endpoint: S3Endpoint = request.getfixturevalue("seaweedfs")
    return TierLocation(f"s3://{endpoint.bucket}/t-{uuid.uuid4().hex[:8]}", endpoint.endpoint).open(
        endpoint.access_key, endpoint.secret_key)


def test_put_get_list_delete(objects) -> None:
    objects.put("data/topic=a%2Fb/day=2026-01-01/x.parquet", b"one")
    objects.put("data/topic=a%2Fb/day=2026-01-01/x.parquet", b"two")  # put replaces
    objects.put("index/00000000000000000000.parquet", b"0123456789")
    objects.put("manifest/00000000000000000001.json", b"{}")
    assert objects.get("data/topic=a%2Fb/day=2026-01-01/x.parquet") == b"two"
    assert objects.get_range("index/00000000000000000000.parquet", 3, 4) == b"3456"
    assert objects.get_range("index/00000000000000000000.parquet", 8, 10) == b"89"
    assert objects.size("index/00000000000000000000.parquet") == 10
    assert [(info.key, info.size) for info in objects.list("")] == [
        ("data/topic=a%2Fb/day=2026-01-01/x.parquet", 3), ("index/00000000000000000000.parquet", 10),
        ("manifest/00000000000000000001.json", 2)]
    assert [info.key for info in objects.list("index/")] == ["index/00000000000000000000.parquet"]
    assert objects.list("nothing/") == []
    objects.delete("index/00000000000000000000.parquet")
    objects.delete("index/00000000000000000000.parquet")  # missing: no error
    with pytest.raises(ObjectNotFound):
        objects.get("index/00000000000000000000.parquet")
    with pytest.raises(ObjectNotFound):
        objects.size("index/00000000000000000000.parquet")


def test_put_if_absent_never_overwrites(objects) -> None:
    assert objects.put_if_absent("manifest/00000000000000000001.json", b"first") is True
    assert objects.put_if_absent("manifest/00000000000000000001.json", b"second") is False
    assert objects.get("manifest/00000000000000000001.json") == b"first"
    assert [info.key for info in objects.list("manifest/")] == ["manifest/00000000000000000001.json"]


def test_keys_that_escape_the_root_are_refused(objects) -> None:
    for key in ("../x", "a//b", "/abs", "", "a/./b"):
        with pytest.raises(ValueError, match="bad object key"):
            objects.put(key, b"x")


def test_wrong_credentials_are_refused_with_a_clear_error(seaweedfs: S3Endpoint) -> None:
    bucket = S3Bucket(seaweedfs.bucket, "refused", endpoint=seaweedfs.endpoint,
                      access_key=seaweedfs.access_key, secret_key="wrong-" + seaweedfs.secret_key)
    with pytest.raises(ObjectStoreError, match="refused the credentials.*access key and secret key"):
        bucket.put("a", b"x")
    stranger = S3Bucket(seaweedfs.bucket, "refused", endpoint=seaweedfs.endpoint,
                        access_key="nobody", secret_key="nothing")
    with pytest.raises(ObjectStoreError, match="refused the credentials"):
        stranger.list("")


def test_missing_bucket_says_to_create_it(seaweedfs: S3Endpoint) -> None:
    bucket = S3Bucket("no-such-bucket-" + uuid.uuid4().hex[:8], endpoint=seaweedfs.endpoint,
                      access_key=seaweedfs.access_key, secret_key=seaweedfs.secret_key)
    with pytest.raises(ObjectStoreError, match="does not exist.*create it"):
        bucket.list("")


def test_unreachable_endpoint_says_what_to_check() -> None:
    port = free_port_pairs(1)[0]  # nothing listens there
    bucket = S3Bucket("tier", endpoint=f"http://127.0.0.1:{port}", access_key="a", secret_key="b")
    with pytest.raises(ObjectStoreError, match=f"cannot reach http://127.0.0.1:{port}.*s3_endpoint"):
        bucket.put("a", b"x")


def test_a_stopped_store_fails_then_serves_again(seaweedfs_server: SeaweedFS) -> None:
    info = seaweedfs_server.info
    bucket = S3Bucket(info.bucket, "restart", endpoint=info.endpoint, access_key=info.access_key,
                      secret_key=info.secret_key)
    bucket.put("kept", b"before")
    with seaweedfs_server.down():
        with pytest.raises(ObjectStoreError, match="cannot reach"):
            bucket.get("kept")
    assert bucket.get("kept") == b"before"


def test_location_round_trips_through_the_data_directory(tmp_path: Path) -> None:
    assert load_location(str(tmp_path)) is None
    location = TierLocation("s3://bucket/some/prefix", "http://127.0.0.1:8333", "eu-west-1")
    save_location(str(tmp_path), location)
    assert load_location(str(tmp_path)) == location
    assert "secret" not in (tmp_path / "tier.json").read_text()
    (tmp_path / "tier.json").write_text("{not json")
    with pytest.raises(ValueError, match="damaged"):
        load_location(str(tmp_path))


def test_file_location_opens_a_directory(tmp_path: Path) -> None:
    objects = TierLocation(f"file://{tmp_path}/tier").open()
    objects.put("a/b", b"x")
    assert (tmp_path / "tier" / "a" / "b").read_bytes() == b"x"
    assert objects.description == f"file://{tmp_path}/tier"


@pytest.mark.parametrize("url", ["http://x/y", "file://relative", "s3:///prefix", "/plain/path"])
def test_bad_locations_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="tier url"):
        TierLocation(url)
