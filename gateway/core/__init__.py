"""The routing core: one build of the services and one admission pipeline, under two
thin front doors.

```
 HTTP endpoints (gateway.http)      Envoy ext_proc picker (gateway.picker)
   read the body, dispatch,            read Envoy's messages, name endpoints,
   stream the answer                   watch the response
            \\                                  /
             └──────── admit(core, ...) ───────┘      gateway.core.admit
                 rate limit → JSON → pins → validate → authorize → classify → route
                                   │
                              Core (gateway.core.services): pools, policy (SLO-aware),
                              router, tenants, limits, admission slots, reporter,
                              watchers; one start, one stop
```

As httpx's transports sit under one client, the front doors differ only in how bytes
arrive and leave; what is decided, and in what order, is written once here.
"""
