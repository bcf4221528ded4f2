import DispatchBenchKit
#if canImport(Glibc)
import Glibc
#endif

// dispatch-bench: a load generator and benchmark runner for Dispatch vs nginx + nchan.
//   dispatch-bench run [--quick|--full|--smoke] [options]   (see `bench/README.md`)
//   dispatch-bench push [options]                            Live Activity pushes (bench/README.md)
//   dispatch-bench worker NAME                               (internal: started by `run`)

let args = Array(CommandLine.arguments.dropFirst())
switch args.first {
case "worker":
    let w = Worker()
    currentWorker = w
    w.run()
case "run":
    exit(BenchMain.run(Array(args.dropFirst())))
case "push":
    exit(PushBench.run(Array(args.dropFirst())))
default:
    log(BenchMain.usage)
    exit(args.first == "--help" || args.first == "-h" ? 0 : 64)
}
