module github.com/loom-ml/loom

go 1.26.8
