import DispatchCore
struct WatchCommand { let options: CLIWatchOptions; let client: Client; func run() -> Int32 { 0 } }
