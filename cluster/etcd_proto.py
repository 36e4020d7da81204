#!/usr/bin/env python3
"""Copies etcd's v3 API .proto files (as Debian's golang-etcd-server-dev ships them) into
the build tree without their Go-only annotations, so protoc needs nothing else.

The gogoproto options only steer Go code generation and the google.api.http options only
the JSON gateway; neither changes a message's wire format, so stubs generated from the
stripped copies talk to any etcd v3 server.

    etcd_proto.py SRC_ROOT OUT_ROOT   (SRC_ROOT holds etcdserver/, mvcc/, auth/)
"""
import os
import re
import sys

FILES = [
    "etcdserver/etcdserverpb/rpc.proto",
    "mvcc/mvccpb/kv.proto",
    "auth/authpb/auth.proto",
]


def strip(text: str) -> str:
    text = re.sub(r'import "(gogoproto/gogo|google/api/annotations)\.proto";\n', "", text)
    text = re.sub(r"option \(gogoproto\.[a-z_]+\) = [a-z]+;\n", "", text)
    text = re.sub(r"\s*option \(google\.api\.http\) = \{.*?\};", "", text, flags=re.S)
    text = re.sub(r"\s*\[\(gogoproto\.[^\]]*\]", "", text)
    if "gogoproto" in text or "google.api" in text:
        raise SystemExit("etcd_proto.py: an annotation this script does not know is left")
    return text


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    for rel in FILES:
        with open(os.path.join(src, rel)) as f:
            text = strip(f.read())
        dst = os.path.join(out, "etcd", rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        # Write only on change, so the generated C++ is not rebuilt for nothing.
        if os.path.exists(dst) and open(dst).read() == text:
            continue
        with open(dst, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
