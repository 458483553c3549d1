"""The WebSocket protocol (`websockets` client): several requests per connection, cancel,
garbage frames, status/metrics/ping, errors, and cancellation when the socket closes."""
import asyncio
import json
import unittest

import websockets

from common import BASE, MODEL, engine_gauge, wait_gauges_zero, wait_idle

WS = BASE.replace("http", "ws", 1) + "/ws"


async def collect(ws, ids):
    """Messages per id until each has its final inference message or an error."""
    out = {i: [] for i in ids}
    open_ids = set(ids)
    while open_ids:
        m = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if m.get("id") in out:
            out[m["id"]].append(m)
            if m["type"] == "error" or (m["type"] == "inference" and m["payload"]["complete"]):
                open_ids.discard(m["id"])
    return out


class WebSocketProtocol(unittest.TestCase):
    def run_async(self, coro):
        return asyncio.run(coro)

    def test_concurrent_requests_on_one_connection(self):
        async def go():
            async with websockets.connect(WS) as ws:
                await ws.send(json.dumps({"type": "inference", "id": "a", "payload": {"prompt": "The sky is", "max_tokens": 8, "temperature": 0, "model": MODEL}}))
                await ws.send(json.dumps({"type": "inference", "id": 42, "payload": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}}))
                await ws.send(json.dumps({"type": "inference", "id": "whole", "payload": {"prompt": "The sky is", "max_tokens": 8, "temperature": 0, "stream": False}}))
                return await collect(ws, ["a", 42, "whole"])
        out = self.run_async(go())
        for i in ["a", 42]:
            msgs = out[i]
            final = msgs[-1]["payload"]
            self.assertTrue(final["complete"], msgs[-1])
            toks = [m["payload"] for m in msgs[:-1]]
            self.assertTrue(all(not t["complete"] and "tokens_per_sec" in t for t in toks))
            self.assertEqual("".join(t["token"] for t in toks), final["text"])
            self.assertEqual(sum(t["token_id"] is not None for t in toks), final["usage"]["completion_tokens"])
        self.assertEqual(len(out["whole"]), 1)
        self.assertEqual(out["whole"][0]["payload"]["text"], out["a"][-1]["payload"]["text"])

    def test_cancel(self):
        async def go():
            async with websockets.connect(WS) as ws:
                await ws.send(json.dumps({"type": "inference", "id": "long", "payload": {"prompt": "Once upon a time, in a land far away,", "max_tokens": 500, "temperature": 0}}))
                while True:
                    m = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    if m["type"] == "inference":
                        self.assertFalse(m["payload"]["complete"], m)
                        break
                await ws.send(json.dumps({"type": "cancel", "id": "long"}))
                return await collect(ws, ["long"])
        out = self.run_async(go())["long"]
        self.assertEqual(out[-1]["payload"]["finish_reason"], "cancelled")
        self.assertLess(out[-1]["payload"]["usage"]["completion_tokens"], 500)

    def test_garbage_frames_and_control_messages(self):
        async def go():
            async with websockets.connect(WS) as ws:
                replies = []
                for frame in ["not json", b"\x00\xff\x10", json.dumps({"no": "type"}), json.dumps({"type": "bogus"}),
                              json.dumps({"type": "inference", "payload": {"prompt": 5}}),
                              json.dumps({"type": "inference", "payload": {"prompt": "x", "temperature": 7}}),
                              json.dumps({"type": "inference", "payload": {"prompt": "x", "model": "nope"}}),
                              json.dumps({"type": "inference", "payload": {}})]:
                    await ws.send(frame)
                    replies.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
                await ws.send(json.dumps({"type": "ping", "id": "p"}))
                pong = json.loads(await asyncio.wait_for(ws.recv(), 30))
                await ws.send(json.dumps({"type": "status", "id": "s"}))
                status = json.loads(await asyncio.wait_for(ws.recv(), 30))
                await ws.send(json.dumps({"type": "metrics", "id": "m"}))
                met = json.loads(await asyncio.wait_for(ws.recv(), 30))
                # still serving after all that
                await ws.send(json.dumps({"type": "inference", "id": "ok", "payload": {"prompt": "Hello", "max_tokens": 3}}))
                ok = await collect(ws, ["ok"])
                return replies, pong, status, met, ok
        replies, pong, status, met, ok = self.run_async(go())
        codes = [r["payload"]["code"] for r in replies]
        self.assertTrue(all(r["type"] == "error" for r in replies), replies)
        self.assertEqual(codes, ["INVALID_REQUEST"] * 6 + ["MODEL_NOT_FOUND", "INVALID_REQUEST"])
        self.assertEqual(pong, {"type": "pong", "id": "p"})
        self.assertEqual(status["type"], "status")
        self.assertIn("smollm2-135m-instruct", status["payload"]["models"])
        self.assertIn("kv_blocks_used", met["payload"]["smollm2-135m-instruct"])
        self.assertTrue(ok["ok"][-1]["payload"]["complete"])

    def test_closing_the_socket_cancels(self):
        wait_idle()

        async def go():
            ws = await websockets.connect(WS)
            # greedy: this prompt runs far past the three tokens we wait for
            await ws.send(json.dumps({"type": "inference", "id": "x", "payload": {"prompt": "Once upon a time, in a land far away,", "max_tokens": 1000, "temperature": 0}}))
            for _ in range(3):
                m = json.loads(await asyncio.wait_for(ws.recv(), 60))
                self.assertFalse(m["payload"].get("complete"), m)
            await ws.close()
        self.run_async(go())
        wait_gauges_zero(("running", "kv_blocks_used"), 10)
        self.assertEqual(engine_gauge("running"), 0)
        self.assertEqual(engine_gauge("kv_blocks_used"), 0)


if __name__ == "__main__":
    unittest.main()


class WebSocketViolations(unittest.TestCase):
    """Frames that break the protocol end the connection with the RFC 6455 code that says why."""

    def close_code(self, send):
        async def go():
            async with websockets.connect(WS, max_size=None) as ws:
                await send(ws)
                try:
                    while True:
                        await asyncio.wait_for(ws.recv(), 30)
                except websockets.ConnectionClosed as e:
                    return e.rcvd.code if e.rcvd else None
        return asyncio.run(go())

    def test_oversized_message_closes_with_1009(self):
        big = json.dumps({"type": "ping", "pad": "x" * (5 << 20)})  # over the 4 MiB message limit
        self.assertEqual(self.close_code(lambda ws: ws.send(big)), 1009)

    def test_text_frame_with_invalid_utf8_closes_with_1007(self):
        async def send(ws):
            from websockets.frames import Frame, Opcode
            ws.protocol.send_frame(Frame(Opcode.TEXT, b"\xff\xfe not utf-8"))
            await ws.send(json.dumps({"type": "ping"}))  # flushes the raw frame
        self.assertEqual(self.close_code(send), 1007)

    def test_stray_continuation_frame_closes_with_1002(self):
        async def send(ws):
            from websockets.frames import Frame, Opcode
            ws.protocol.send_frame(Frame(Opcode.CONT, b"continuation of nothing"))
            await ws.send(json.dumps({"type": "ping"}))
        self.assertEqual(self.close_code(send), 1002)
