import Foundation
import PackagePlugin

/// Compiles directories of text files into the target that applies this plugin, so a binary
/// carries them (no files to install, nothing fetched at build time).
///
/// Generic: every `NAME.embed` file in the target's directory names one directory (a path
/// relative to that `.embed` file, on its first line); the plugin generates `NAME.swift` with
/// `public enum NAME { public static let files: [String: String] }`, keyed by file name, the
/// contents as raw string literals (fast to compile, unlike byte-array literals). Hidden files
/// are skipped; subdirectories are not descended into. Exclude the `.embed` file from the
/// target's sources in Package.swift.
@main
struct EmbedFiles: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) async throws -> [Command] {
        guard let module = target as? SourceModuleTarget else { return [] }
        // `directoryURL` needs tools 6.1; the package is 6.0.
        let dir = URL(fileURLWithPath: String(describing: module.directory))
        let fm = FileManager.default
        let tool = try context.tool(named: "embed-files")
        var commands: [Command] = []
        for name in try fm.contentsOfDirectory(atPath: dir.path).sorted() where name.hasSuffix(".embed") {
            let manifest = dir.appendingPathComponent(name)
            let enumName = String(name.dropLast(".embed".count))
            let text = try String(contentsOf: manifest, encoding: .utf8)
            guard let line = text.split(whereSeparator: \.isNewline).first.map({ $0.trimmingCharacters(in: .whitespaces) }), !line.isEmpty else {
                throw EmbedError("\(manifest.path): the first line must name a directory")
            }
            let source = URL(fileURLWithPath: line, relativeTo: dir).standardizedFileURL
            var inputs: [URL] = []
            for file in try fm.contentsOfDirectory(atPath: source.path).sorted() where !file.hasPrefix(".") {
                let url = source.appendingPathComponent(file)
                var isDir: ObjCBool = false
                if fm.fileExists(atPath: url.path, isDirectory: &isDir), !isDir.boolValue { inputs.append(url) }
            }
            let output = context.pluginWorkDirectoryURL.appendingPathComponent("\(enumName).swift")
            commands.append(.buildCommand(
                displayName: "Embedding \(inputs.count) files of \(source.lastPathComponent)/ as \(enumName)",
                executable: tool.url,
                arguments: [enumName, output.path] + inputs.map(\.path),
                inputFiles: inputs + [manifest],
                outputFiles: [output]))
        }
        return commands
    }
}

struct EmbedError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}
