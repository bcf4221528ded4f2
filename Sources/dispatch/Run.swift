import DispatchCore
struct RunCommand { let options: CLIRunOptions; let client: Client; func run() -> Int32 { 0 } }
