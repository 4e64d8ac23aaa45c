"""`ray start --address GCS --node-ip-address 127.0.0.1` for a worker node of the loopback cluster of
ray-head.sh. Ray's CLI replaces a loopback node or GCS address by the machine's external address
(services.resolve_ip_for_localhost), and then its servers listen on every interface; the head avoids that
with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which Ray refuses for a second node. So this keeps the address
as given. Pinned Ray (2.60): the multi-node test fails if the function moves."""

import ray._private.services as services
from ray.scripts.scripts import main

services.resolve_ip_for_localhost = lambda host: host
main()
