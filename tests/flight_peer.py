#!/usr/bin/env python3
"""A Longbow-like Arrow Flight peer for Quarrel's tests, on pyarrow's real Flight server.

Behaviour (Longbow's documented interface):
  data port  (DoPut ingest, DoGet)            -- reached through a TCP proxy that can cut
                                                 every live connection on command
  meta port  (GetFlightInfo, ListFlights, DoAction; DoPut is refused)

  DoPut     descriptor PATH [dataset, ...]; the dataset is created from the first schema;
            `id` utf8 and `vector` fixed_size_list<float32>[dim] are required (a variable
            list is refused: no dimension); optional `metadata` and `text`.
            One PutResult per stored batch, app metadata JSON:
              {"status": "ok", "rows": n}  or  {"status": "slow_down", "reason": "wal_pressure", "rows": n}
  DoGet     ticket JSON {"name": dataset, "limit": n}  -> stored rows (all columns)
            ticket JSON {"search": {"dataset", "vector": [...], "k"}}  -> brute-force k-NN:
            columns id, score (cosine similarity), descending
  GetFlightInfo  PATH [dataset] -> schema and total_records
  DoAction  "search" (body: the search JSON) -> one JSON result
            test controls (meta port): "peer.slow_down" {"batches": n} (the next n acks say
            slow_down), "peer.drop_after" {"batches": n} (after storing n more batches, cut
            every data connection before acking the last one; with "foreign_rows": m, also
            store m rows from "another writer" at that moment), "peer.stats" -> JSON with
            per-dataset rows, batch arrival times, puts, drops, duplicate ids.

Prints `READY data=<port> meta=<port>` on stdout when both ports listen.
"""

import argparse
import json
import socket
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl


class Store:
    def __init__(self):
        self.lock = threading.Lock()
        self.schemas = {}
        self.batches = {}
        self.arrivals = {}
        self.slow_down = 0
        self.drop_after = None
        self.foreign_rows = 0
        self.drops = 0
        self.puts = 0

    def table(self, name):
        with self.lock:
            if name not in self.schemas:
                raise fl.FlightServerError(f"dataset {name!r} not found")
            return pa.Table.from_batches(self.batches[name], schema=self.schemas[name])

    def stats(self):
        with self.lock:
            out = {"puts": self.puts, "drops": self.drops, "datasets": {}}
            for name, bs in self.batches.items():
                ids = [i for b in bs for i in b.column("id").to_pylist()]
                out["datasets"][name] = {
                    "rows": len(ids),
                    "batches": len(bs),
                    "duplicate_ids": len(ids) - len(set(ids)),
                    "arrivals": self.arrivals[name],
                }
            return out


def dim_of(schema):
    if schema.get_field_index("id") < 0 or schema.get_field_index("vector") < 0:
        raise fl.FlightServerError("schema needs `id` (utf8) and `vector` (fixed_size_list<float32>) columns")
    if schema.field("id").type not in (pa.utf8(), pa.large_utf8()):
        raise fl.FlightServerError("`id` must be utf8")
    t = schema.field("vector").type
    if not pa.types.is_fixed_size_list(t):
        raise fl.FlightServerError(f"`vector` must be fixed_size_list<float32>[dim] (got {t}): no dimension to detect")
    if t.value_type != pa.float32():
        raise fl.FlightServerError(f"`vector` values must be float32 (got {t.value_type})")
    return t.list_size


def search(store, q):
    name, k = q["dataset"], int(q.get("k", 10))
    table = store.table(name)
    dim = dim_of(table.schema)
    v = np.asarray(q["vector"], dtype=np.float32)
    if v.shape != (dim,):
        raise fl.FlightServerError(f"query vector has {v.size} values, dataset {name!r} has dim {dim}")
    if table.num_rows == 0:
        return pa.table({"id": pa.array([], pa.utf8()), "score": pa.array([], pa.float32())})
    mat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    norms = np.linalg.norm(mat, axis=1) * max(np.linalg.norm(v), 1e-30)
    scores = (mat @ v) / np.maximum(norms, 1e-30)
    top = np.argsort(-scores, kind="stable")[:k]
    ids = table.column("id").combine_chunks().take(pa.array(top))
    return pa.table({"id": ids, "score": pa.array(scores[top], pa.float32())})


def parse_ticket(raw):
    try:
        return json.loads(raw)
    except ValueError as e:
        raise fl.FlightServerError(f"ticket is not JSON: {e}")


class DataServer(fl.FlightServerBase):
    def __init__(self, location, store, proxy):
        super().__init__(location)
        self.store, self.proxy = store, proxy

    def do_put(self, context, descriptor, reader, writer):
        if descriptor.descriptor_type != fl.DescriptorType.PATH or not descriptor.path:
            raise fl.FlightServerError("DoPut needs a PATH descriptor whose first element is the dataset")
        name = descriptor.path[0].decode()
        schema = reader.schema
        dim_of(schema)
        st = self.store
        with st.lock:
            st.puts += 1
            if name not in st.schemas:
                st.schemas[name], st.batches[name], st.arrivals[name] = schema, [], []
            elif not st.schemas[name].equals(schema):
                raise fl.FlightServerError(f"schema differs from dataset {name!r}'s: {st.schemas[name]}")
        for chunk in reader:
            batch = chunk.data
            with st.lock:
                st.batches[name].append(batch)
                st.arrivals[name].append(time.monotonic())
                drop = False
                if st.drop_after is not None:
                    st.drop_after -= 1
                    if st.drop_after <= 0:
                        st.drop_after, drop = None, True
                        st.drops += 1
                        if st.foreign_rows:
                            m, st.foreign_rows = st.foreign_rows, 0
                            st.batches[name].append(batch.slice(0, min(m, batch.num_rows)))
                            st.arrivals[name].append(time.monotonic())
                status = {"status": "ok", "rows": batch.num_rows}
                if st.slow_down > 0:
                    st.slow_down -= 1
                    status = {"status": "slow_down", "reason": "wal_pressure", "rows": batch.num_rows}
            if drop:
                # stored, never acknowledged: the client must find out by itself
                self.proxy.drop_all()
                raise fl.FlightUnavailableError("connection dropped by test peer")
            writer.write(pa.py_buffer(json.dumps(status).encode()))

    def do_get(self, context, ticket):
        t = parse_ticket(ticket.ticket)
        if "search" in t:
            return fl.RecordBatchStream(search(self.store, t["search"]))
        if "name" not in t:
            raise fl.FlightServerError('ticket needs "name" or "search"')
        table = self.store.table(t["name"])
        if t.get("limit") is not None:
            table = table.slice(0, int(t["limit"]))
        return fl.RecordBatchStream(table)


class MetaServer(fl.FlightServerBase):
    def __init__(self, location, store):
        super().__init__(location)
        self.store = store

    def _info(self, name):
        table = self.store.table(name)
        desc = fl.FlightDescriptor.for_path(name)
        ticket = fl.Ticket(json.dumps({"name": name}).encode())
        return fl.FlightInfo(table.schema, desc, [fl.FlightEndpoint(ticket, [])], table.num_rows, table.nbytes)

    def get_flight_info(self, context, descriptor):
        if descriptor.descriptor_type != fl.DescriptorType.PATH or not descriptor.path:
            raise fl.FlightServerError("GetFlightInfo needs a PATH descriptor")
        name = descriptor.path[0].decode()
        with self.store.lock:
            known = name in self.store.schemas
        if not known:
            raise fl.FlightServerError(f"dataset {name!r} not found")
        return self._info(name)

    def list_flights(self, context, criteria):
        with self.store.lock:
            names = list(self.store.schemas)
        for n in names:
            yield self._info(n)

    def do_put(self, context, descriptor, reader, writer):
        raise fl.FlightUnavailableError("DoPut is served on the data port, not the meta port")

    def list_actions(self, context):
        return [("search", "k-NN search"), ("peer.slow_down", ""), ("peer.drop_after", ""), ("peer.stats", "")]

    def do_action(self, context, action):
        body = json.loads(action.body.to_pybytes() or b"{}")
        st = self.store
        if action.type == "search":
            t = search(st, body.get("search", body))
            rows = [{"id": i, "score": s} for i, s in zip(t.column("id").to_pylist(), t.column("score").to_pylist())]
            return [json.dumps(rows).encode()]
        if action.type == "peer.slow_down":
            with st.lock:
                st.slow_down = int(body["batches"])
            return [b"{}"]
        if action.type == "peer.drop_after":
            with st.lock:
                st.drop_after = int(body["batches"])
                st.foreign_rows = int(body.get("foreign_rows", 0))
            return [b"{}"]
        if action.type == "peer.stats":
            return [json.dumps(st.stats()).encode()]
        raise fl.FlightServerError(f"unknown action {action.type!r}")


class Proxy:
    """Forwards a loopback port to the data server; `drop_all` cuts every live connection."""

    def __init__(self, upstream_port, listen_port=0):
        self.upstream = upstream_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", listen_port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            c, _ = self.sock.accept()
            u = socket.create_connection(("127.0.0.1", self.upstream))
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.conns.append((c, u))
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop_all(self):
        with self.lock:
            conns, self.conns = self.conns, []
        for pair in conns:
            for s in pair:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-port", type=int, default=0, help="0: any free port")
    ap.add_argument("--meta-port", type=int, default=0, help="0: any free port")
    a = ap.parse_args()
    store = Store()
    inner = DataServer("grpc://127.0.0.1:0", store, None)
    proxy = Proxy(inner.port, a.data_port)
    inner.proxy = proxy
    data_port = proxy.port
    meta = MetaServer(f"grpc://127.0.0.1:{a.meta_port}", store)
    print(f"READY data={data_port} meta={meta.port}", flush=True)
    # serve until stdin closes (the test process exits) or a signal arrives
    threading.Thread(target=lambda: (sys.stdin.read(), inner.shutdown(), meta.shutdown()), daemon=True).start()
    meta.serve()


if __name__ == "__main__":
    main()
