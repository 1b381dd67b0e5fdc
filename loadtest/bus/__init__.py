"""What the bus costs: the request path's bus operations on one server against a replicated cluster
(`bus_ops_bench`), a bounded synthetic load of codes and audio at N streams' rates (`bus_load`), the messages and
bytes a real mesh puts on each subject (`subject_census`), and first packet through `voxmesh up` with one server
and with a cluster of three (`replication_bench`)."""
