import DispatchBlockingHTTP
import DispatchCore
import DispatchBenchKit
import DispatchSystem
#if canImport(Glibc)
import Glibc
#endif

/// A plain blocking HTTP/1.1 exchange (Connection: close) returning the body.
enum PlainHTTP {
    static func request(port: UInt16, method: String, path: String, address: String = "127.0.0.1") -> [UInt8]? {
        let request = HTTPRequestEncoder.encode(method: method, target: path, host: "bench", body: [])
        return try? HTTP1Connection.exchange(host: address, port: Int(port), request: request, timeout: 10, maxBody: .max).body
    }
}

/// Prometheus text of a server. dispatchd answers /metrics for the whole server (every
/// worker's samples summed; `dispatch_db_up` the lowest), so one scrape is enough. (It once
/// answered per worker, and scraping until every `worker="N"` had been seen, as this did,
/// now counted the whole server once per worker label it saw.)
struct Metrics {
    var samples: [String: [String: Double]] = [:]  // "server" -> "name{labels}" -> value

    static func scrape(port: UInt16, workers: Int = 1) -> Metrics {
        var m = Metrics()
        for attempt in 0..<8 {
            let address = Servers.addresses[attempt % Servers.addresses.count]
            guard let body = PlainHTTP.request(port: port, method: "GET", path: "/metrics", address: address) else { continue }
            var values: [String: Double] = [:]
            for line in String(decoding: body, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
                guard let space = line.lastIndex(of: " "), let v = Double(line[line.index(after: space)...]) else { continue }
                values[String(line[..<space])] = v
            }
            if !values.isEmpty {
                m.samples["server"] = values
                break
            }
        }
        return m
    }

    /// The sum over workers of every sample of `name` whose labels contain `label`.
    func sum(_ name: String, _ label: String = "") -> Double {
        samples.values.reduce(0.0) { total, values in
            total + values.filter { ($0.key == name || $0.key.hasPrefix(name + "{")) && (label.isEmpty || $0.key.contains(label)) }
                .reduce(0.0) { $0 + $1.value }
        }
    }

    func max(_ name: String) -> Double {
        samples.values.compactMap { $0.first { $0.key == name || $0.key.hasPrefix(name + "{") }?.value }.max() ?? 0
    }

    /// A histogram's cumulative buckets (upper bound -> count) over the series whose labels
    /// contain `label`.
    func histogram(_ name: String, _ label: String = "") -> CumulativeHistogram {
        var buckets: [Double: Double] = [:]
        for values in samples.values {
            for (key, v) in values where key.hasPrefix(name + "_bucket{") && (label.isEmpty || key.contains(label)) {
                guard let r = key.firstRange(of: "le=\""), let le = Double(key[r.upperBound...].prefix { $0 != "\"" }) ?? (key.contains("+Inf") ? .infinity : nil)
                else { continue }
                buckets[le, default: 0] += v
            }
        }
        return CumulativeHistogram(buckets: buckets)
    }
}

/// Prometheus buckets: percentiles by linear interpolation inside the bucket that holds them.
struct CumulativeHistogram {
    var buckets: [Double: Double]

    func subtracting(_ other: CumulativeHistogram) -> CumulativeHistogram {
        CumulativeHistogram(buckets: buckets.reduce(into: [:]) { $0[$1.key] = $1.value - (other.buckets[$1.key] ?? 0) })
    }

    func percentile(_ q: Double) -> Double? {
        let sorted = buckets.sorted { $0.key < $1.key }
        guard let total = sorted.last?.value, total > 0 else { return nil }
        let rank = q * total
        var previousBound = 0.0, previousCount = 0.0
        for (bound, count) in sorted {
            if count >= rank {
                if bound.isInfinite { return previousBound }
                let inBucket = count - previousCount
                return inBucket <= 0 ? bound : previousBound + (bound - previousBound) * (rank - previousCount) / inBucket
            }
            previousBound = bound
            previousCount = count
        }
        return nil
    }
}
