// Dispatch from Node 18+ with the built-in fetch: publish, then follow the status stream
// (Node has no EventSource; the stream is read as text and split into SSE events), resuming
// with Last-Event-ID after a drop.
//   DISPATCH_URL=... DISPATCH_TOKEN=... node dispatch-node.mjs
const base = (process.env.DISPATCH_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const auth = { Authorization: `Bearer ${process.env.DISPATCH_TOKEN}` };
const terminal = new Set(["completed", "error", "cancelled", "rejected"]);

export async function publish(path, body) {
  const key = crypto.randomUUID(); // the same key on every retry: applied once
  for (let attempt = 0; ; attempt++) {
    try {
      const answer = await fetch(base + path, {
        method: "POST",
        headers: { ...auth, "Content-Type": "application/json", "Idempotency-Key": key },
        body: JSON.stringify(body),
      });
      const json = await answer.json();
      if (answer.ok) return json;
      const again = answer.status >= 500 || (answer.status === 429 && json.error?.code === "rate_limited");
      if (!again || attempt >= 5) throw new Error(`${json.error?.message} (${json.error?.code}, HTTP ${answer.status})`);
    } catch (e) {
      if (!(e instanceof TypeError) || attempt >= 5) throw e; // TypeError: no connection
    }
    await new Promise((r) => setTimeout(r, 200 * 2 ** attempt));
  }
}

export async function* follow(id, lastEventId) {
  for (;;) {
    const headers = { ...auth, Accept: "text/event-stream" };
    if (lastEventId !== undefined) headers["Last-Event-ID"] = String(lastEventId);
    try {
      const answer = await fetch(`${base}/v1/activities/${encodeURIComponent(id)}/status`, { headers });
      if (answer.status === 204) return;
      if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
      const decoder = new TextDecoder();
      let buffer = "";
      for await (const chunk of answer.body) {
        buffer += decoder.decode(chunk, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const event = {};
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue;
            const colon = line.indexOf(":");
            event[line.slice(0, colon)] = line.slice(colon + 1).replace(/^ /, "");
          }
          if (!event.data) continue;
          const snapshot = JSON.parse(event.data);
          if (event.id) lastEventId = Number(event.id);
          yield { seq: lastEventId, event: event.event, snapshot };
          if (event.event === "not_found" || terminal.has(snapshot.state)) return;
        }
      }
    } catch (e) {
      if (e.message.startsWith("HTTP")) throw e;
    }
    await new Promise((r) => setTimeout(r, 3000)); // dropped: resume with Last-Event-ID
  }
}

// Run as a script: one activity from start to end, followed while it runs.
if (import.meta.url === `file://${process.argv[1]}`) {
  const started = await publish("/v1/activities/start", { taskName: "Node example", state: "processing" });
  const id = started.activityId;
  const seen = (async () => {
    const events = [];
    for await (const e of follow(id)) events.push(`${e.seq} ${e.event}`);
    return events;
  })();
  await publish(`/v1/activities/${id}/update`, { progress: 0.5, status: "Halfway" });
  await publish(`/v1/activities/${id}/end`, { status: "Done" });
  console.log(id, (await seen).join(", "));
}
