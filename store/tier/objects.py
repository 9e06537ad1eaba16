"""Object storage for the tier: a local directory or an S3 bucket, behind one small protocol.

Keys are ``/``-separated and relative to the tier root (the directory, or bucket + prefix).
Every write is whole: a reader sees an object entirely or not at all. ``put_if_absent`` never
overwrites, which is what makes manifest versions safe against two writers (manifest.py).
Where the tier is, without secrets, is kept in ``<data>/tier.json`` so that a ``StoreReader``
or Spark finds it from the data directory alone.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from ..durable_files import fsync_directory, replace_file
from ..errors import StoreError

LOCATION_FILE = "tier.json"
ACCESS_KEY_ENV = "SLUICE_TIER_S3_ACCESS_KEY"
SECRET_KEY_ENV = "SLUICE_TIER_S3_SECRET_KEY"
_TEMP_PREFIX = ".tmp-"


class ObjectStoreError(StoreError):
    """The object store failed (unreachable, refused, full); the message says what to do."""


class ObjectNotFound(ObjectStoreError):
    """No object has that key."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing."""

    key: str
    size: int


class ObjectStore(Protocol):
    """Where tiered objects live."""

    description: str
    """Where that is, for messages: ``s3://bucket/prefix at http://127.0.0.1:8333``, ``file:///x``."""

    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` whole, replacing any object of that key."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``key`` unless it exists: False (and nothing written) if it does."""

    def get(self, key: str) -> bytes:
        """The object's bytes; ObjectNotFound if there is none."""

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of the object from ``start`` (fewer at its end)."""

    def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFound if there is none."""

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""

    def delete(self, key: str) -> None:
        """Remove the object; a missing one is no error."""


def check_key(key: str) -> str:
    """``key`` if it is a relative ``/``-separated key with no empty, ``.`` or ``..`` part."""
    parts = key.split("/")
    if not key or any(part in ("", ".", "..") for part in parts) or "\0" in key:
        raise ValueError(f"bad object key {key!r}: keys are relative, /-separated, with no empty, "
                         "'.' or '..' part")
    return key


class LocalDirectory:
    """Objects as files under ``root`` (a shared file system, or tests)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.description = f"file://{self.root}"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def _write_temp(self, path: str, data: bytes) -> str:
        """A new fsynced temporary file beside ``path`` holding ``data``."""
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=directory)
        except OSError as error:
            raise self._failed("write", path, error) from None
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
        except OSError as error:
            os.unlink(temp)
            raise self._failed("write", path, error) from None
        return temp

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        temp = self._write_temp(path, data)
        try:
            os.rename(temp, path)
            fsync_directory(os.path.dirname(path), site="tier")
        except OSError as error:
            _unlink_quietly(temp)
            raise self._failed("write", path, error) from None

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        temp = self._write_temp(path, data)
        try:
            os.link(temp, path)  # atomic, and never replaces an existing file
            fsync_directory(os.path.dirname(path), site="tier")
        except FileExistsError:
            return False
        except OSError as error:
            raise self._failed("write", path, error) from None
        finally:
            _unlink_quietly(temp)
        return True

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as file:
                return file.read()
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {key!r} in {self.description}") from None
        except OSError as error:
            raise self._failed("read", path, error) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as file:
                return os.pread(file.fileno(), length, start)
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {key!r} in {self.description}") from None
        except OSError as error:
            raise self._failed("read", path, error) from None

    def size(self, key: str) -> int:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {key!r} in {self.description}") from None

    def list(self, prefix: str) -> list[ObjectInfo]:
        out = []
        for directory, _, names in os.walk(self.root):
            relative = os.path.relpath(directory, self.root)
            base = "" if relative == "." else relative.replace(os.sep, "/") + "/"
            if not (base.startswith(prefix) or prefix.startswith(base)):
                continue
            for name in names:
                key = base + name
                if name.startswith(_TEMP_PREFIX) or not key.startswith(prefix):
                    continue
                try:
                    out.append(ObjectInfo(key, os.stat(os.path.join(directory, name)).st_size))
                except FileNotFoundError:
                    continue  # deleted meanwhile
        return sorted(out, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            return
        except OSError as error:
            raise self._failed("delete", self._path(key), error) from None

    def _failed(self, action: str, path: str, error: OSError) -> ObjectStoreError:
        return ObjectStoreError(f"could not {action} {path} ({error.strerror or error}): check that the "
                                f"tier directory {self.root} exists, is writable and has free space")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


_REFUSED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
                  "ExpiredToken", "AuthorizationHeaderMalformed", "403"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_TAKEN_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}


class S3Bucket:
    """Objects in an S3 bucket under a prefix, through boto3 (any S3-compatible service)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str = "", region: str = "us-east-1",
                 access_key: str = "", secret_key: str = "") -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint = endpoint
        where = f" at {endpoint}" if endpoint else ""
        self.description = f"s3://{bucket}/{self.prefix}{where}"
        credentials = {"aws_access_key_id": access_key, "aws_secret_access_key": secret_key} \
            if access_key or secret_key else {}
        session = boto3.session.Session()

        def client(connect_timeout: float, read_timeout: float, attempts: int) -> Any:
            options: dict[str, Any] = {"connect_timeout": connect_timeout, "read_timeout": read_timeout,
                                       "retries": {"max_attempts": attempts, "mode": "standard"}}
            if endpoint:
                options["s3"] = {"addressing_style": "path"}
            try:  # checksums only where S3 requires them: S3-compatible services differ in the rest
                config = Config(**options, request_checksum_calculation="when_required",
                                response_checksum_validation="when_required")
            except TypeError:  # botocore before 1.36 sends none it is not asked for
                config = Config(**options)
            return session.client("s3", endpoint_url=endpoint or None, region_name=region, config=config,
                                  **credentials)

        self._client = client(*WRITE_TIMEOUTS)
        self._reads = client(*READ_TIMEOUTS)
        """Gets, range gets and heads: short timeouts and one retry, so that a stalled object
        store fails a read within seconds instead of holding its reader (and its thread)."""

    def _call(self, operation: str, key: str, **arguments: Any) -> Any:
        """Call the client, turning its errors into ObjectStoreError that say what to check."""
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

        client = self._reads if operation in _READS else self._client
        try:
            return getattr(client, operation)(Bucket=self.bucket, **arguments)
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _MISSING_CODES or (status == "404" and code != "NoSuchBucket"):
                raise ObjectNotFound(f"no object {key!r} in {self.description}") from None
            if code in _TAKEN_CODES or status == "412":
                raise _Taken() from None
            if code == "NoSuchBucket":
                raise ObjectStoreError(f"bucket {self.bucket!r} does not exist at {self._where()}: create it "
                                       "or correct the tier url") from None
            if code in _REFUSED_CODES or status == "403":
                raise ObjectStoreError(f"{self._where()} refused the credentials for {self.description} "
                                       f"({code}): check the tier's S3 access key and secret key "
                                       f"({ACCESS_KEY_ENV}/{SECRET_KEY_ENV}) and the bucket's "
                                       "permissions") from None
            raise ObjectStoreError(f"{operation} of {key!r} in {self.description} failed: {code or status} "
                                   f"{error.response.get('Error', {}).get('Message', '')}".rstrip()) from None
        except EndpointConnectionError:
            raise ObjectStoreError(f"cannot reach {self._where()} for {self.description}: check the tier's "
                                   "s3_endpoint and that the object store is running and reachable") from None
        except NoCredentialsError:
            raise ObjectStoreError(f"no S3 credentials for {self.description}: set the tier's s3_access_key "
                                   f"and s3_secret_key ({ACCESS_KEY_ENV}/{SECRET_KEY_ENV})") from None
        except BotoCoreError as error:
            raise ObjectStoreError(f"{operation} of {key!r} in {self.description} failed ({error}): check "
                                   "that the object store at the tier's s3_endpoint is running") from None

    def _where(self) -> str:
        return self.endpoint or "S3"

    def put(self, key: str, data: bytes) -> None:
        self._call("put_object", key, Key=self.prefix + check_key(key), Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            self._call("put_object", key, Key=self.prefix + check_key(key), Body=data, IfNoneMatch="*")
        except _Taken:
            return False
        return True

    def get(self, key: str) -> bytes:
        return self._call("get_object", key, Key=self.prefix + check_key(key))["Body"].read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            response = self._call("get_object", key, Key=self.prefix + check_key(key),
                                  Range=f"bytes={start}-{start + length - 1}")
        except ObjectStoreError as error:
            if "InvalidRange" in str(error):  # start at or past the end
                return b""
            raise
        return response["Body"].read()

    def size(self, key: str) -> int:
        return int(self._call("head_object", key, Key=self.prefix + check_key(key))["ContentLength"])

    def list(self, prefix: str) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", prefix, Prefix=self.prefix + prefix, **token)
            out += [ObjectInfo(item["Key"][len(self.prefix):], int(item["Size"])) for item in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return sorted(out, key=lambda info: info.key)
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def delete(self, key: str) -> None:
        try:
            self._call("delete_object", key, Key=self.prefix + check_key(key))
        except ObjectNotFound:
            return


_READS = frozenset({"get_object", "head_object"})
WRITE_TIMEOUTS = (5.0, 60.0, 3)
"""(connect timeout s, read timeout s, attempts) of puts, listings and deletes."""
READ_TIMEOUTS = (2.0, 5.0, 2)
"""The same for gets and heads (whole objects, ranges, sizes)."""


class _Taken(Exception):
    """A conditional put found the key taken."""


@dataclass(frozen=True)
class TierLocation:
    """Where the tier is, without secrets (``<data>/tier.json``)."""

    url: str
    """``file:///abs/dir`` or ``s3://bucket/prefix``."""
    s3_endpoint: str = ""
    """An S3-compatible service's URL (``http://127.0.0.1:8333``); empty: AWS."""
    s3_region: str = "us-east-1"

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme == "file":
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                raise ValueError(f"tier url {self.url!r}: a file url names an absolute directory, "
                                 "e.g. file:///var/lib/sluice-tier")
        elif parts.scheme == "s3":
            if not parts.netloc:
                raise ValueError(f"tier url {self.url!r} names no bucket: use s3://bucket/prefix")
        else:
            raise ValueError(f"tier url {self.url!r}: use file:///absolute/dir or s3://bucket/prefix")
        if self.s3_endpoint and urlsplit(self.s3_endpoint).scheme not in ("http", "https"):
            raise ValueError(f"tier s3_endpoint {self.s3_endpoint!r}: use http://host:port or https://host:port")

    def open(self, access_key: str = "", secret_key: str = "") -> ObjectStore:
        """The object store this location names. S3 credentials: the arguments, else the
        SLUICE_TIER_S3_ACCESS_KEY/SECRET_KEY environment variables, else boto3's own chain."""
        parts = urlsplit(self.url)
        if parts.scheme == "file":
            return LocalDirectory(unquote(parts.path))
        access_key = access_key or os.environ.get(ACCESS_KEY_ENV, "")
        secret_key = secret_key or os.environ.get(SECRET_KEY_ENV, "")
        return S3Bucket(parts.netloc, parts.path, endpoint=self.s3_endpoint, region=self.s3_region,
                        access_key=access_key, secret_key=secret_key)


def save_location(data_dir: str, location: TierLocation) -> None:
    """Record ``location`` in ``<data_dir>/tier.json`` (no secrets)."""
    replace_file(os.path.join(data_dir, LOCATION_FILE), json.dumps(asdict(location)).encode(), site="tier")


def load_location(data_dir: str) -> TierLocation | None:
    """The location recorded in ``<data_dir>/tier.json``; None if the store has no tier."""
    path = os.path.join(data_dir, LOCATION_FILE)
    try:
        with open(path, "rb") as file:
            raw = json.loads(file.read())
        return TierLocation(str(raw["url"]), str(raw.get("s3_endpoint", "")), str(raw.get("s3_region", "us-east-1")))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is damaged ({error}): delete it and restart the broker, which "
                         "writes it again from its [tier] settings") from None
