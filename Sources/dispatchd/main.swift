import DispatchServer
import Glibc

exit(Dispatchd.main(Array(CommandLine.arguments.dropFirst())))
