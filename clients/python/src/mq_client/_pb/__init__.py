"""Generated gRPC stubs of ``mq.v1`` (``mq/v1/*_pb2.py``), made by the build hook
(``hatch_build.py``) from ``proto/proto/mq/v1/*.proto``; nothing here is committed but this file."""
